"""Whether the doctor runs in a container, and which kind: the fix for a memlock limit or a
missing verbs device node depends on where the process runs."""

from __future__ import annotations

import dataclasses

from gdrprobe.report.model import Evidence

INIT_CGROUP_FILE = "/proc/1/cgroup"
# cgroup paths that name a container runtime (cgroup v1; under v2 /proc/1/cgroup is "0::/").
CGROUP_RUNTIME_MARKERS = (("kubepods", "kubernetes"), ("docker", "docker"),
                          ("libpod", "podman"), ("containerd", "containerd"), ("lxc", "lxc"))
RUNTIME_FILES = (("/.dockerenv", "docker"), ("/run/.containerenv", "podman"))


@dataclasses.dataclass(frozen=True)
class Container:
    kind: str | None          # "kubernetes", "docker", "podman", ...; None on the host
    evidence: tuple[Evidence, ...]


def detect_container(ctx) -> Container:
    """Whether the doctor runs in a container, and which kind, from the usual markers."""
    evidence = []
    kind = None
    cgroup = ctx.root.read(INIT_CGROUP_FILE) or ""
    for marker, runtime in CGROUP_RUNTIME_MARKERS:
        if marker in cgroup:
            kind = kind or runtime
            evidence.append(Evidence(INIT_CGROUP_FILE, f"mentions {marker}"))
            break
    for path, runtime in RUNTIME_FILES:
        if ctx.root.exists(path):
            kind = kind or runtime
            evidence.append(Evidence(path, "present"))
    if "KUBERNETES_SERVICE_HOST" in ctx.environ:
        # A pod's runtime may be docker or containerd; the fix belongs in the pod spec.
        kind = "kubernetes"
        evidence.append(Evidence("environment KUBERNETES_SERVICE_HOST", ctx.environ["KUBERNETES_SERVICE_HOST"]))
    return Container(kind, tuple(evidence))
