"""Can this process pin the memory the probe registers? RLIMIT_MEMLOCK and CAP_IPC_LOCK.

Registering host memory, and creating queue pairs and completion queues, pins pages that
the kernel charges to RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK. A low limit
shows up as "ibv_reg_mr failed" or "ibv_create_qp failed" (NCCL prints both). The fix
depends on where the process runs, so the container it runs in is detected too.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from gdrprobe.doctor.context import DoctorContext
from gdrprobe.doctor.gpu import MiB, PROBE_ARM_PINNED_BYTES, format_mib
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

finding = functools.partial(Finding, group="memlock")

LIMITS_FILE = "/proc/self/limits"
STATUS_FILE = "/proc/self/status"
INIT_CGROUP_FILE = "/proc/1/cgroup"
CAP_IPC_LOCK_BIT = 14
# Host-pinned memory: the host arm's buffers, the staged arm's bounce buffers, and a
# margin for the verbs queues (QP and CQ rings are pinned too). GPU memory registered
# through DMA-BUF or peermem is not charged to RLIMIT_MEMLOCK.
QUEUE_MARGIN_BYTES = 4 * MiB
PROBE_MEMLOCK_BYTES = 2 * PROBE_ARM_PINNED_BYTES + QUEUE_MARGIN_BYTES

# cgroup paths that name a container runtime (cgroup v1; under v2 /proc/1/cgroup is "0::/").
CGROUP_RUNTIME_MARKERS = (("kubepods", "kubernetes"), ("docker", "docker"),
                          ("libpod", "podman"), ("containerd", "containerd"), ("lxc", "lxc"))

KUBERNETES_FIX = ('Add the capability to the container: securityContext.capabilities.add: ["IPC_LOCK"] '
                  "(the memlock limit then no longer applies to RDMA registrations).")
DOCKER_FIX = "Run the container with `--ulimit memlock=-1:-1` or `--cap-add IPC_LOCK`."
HOST_FIX = ("Set `* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.conf, "
            "then log in again (or set the Slurm/systemd launch limits); check with `ulimit -l`.")


# ---- facts ------------------------------------------------------------------


def memlock_limits(root: SysRoot) -> tuple[str, str] | None:
    """(soft, hard) of "Max locked memory" as written: a number of bytes or "unlimited"."""
    for line in (root.read(LIMITS_FILE) or "").splitlines():
        match = re.match(r"Max locked memory\s+(\S+)\s+(\S+)", line)
        if match:
            return match.group(1), match.group(2)
    return None


def limit_bytes(value: str) -> float:
    return float("inf") if value == "unlimited" else int(value)


def effective_capabilities(root: SysRoot) -> int | None:
    for line in (root.read(STATUS_FILE) or "").splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return None


def has_ipc_lock(cap_eff: int) -> bool:
    return bool(cap_eff >> CAP_IPC_LOCK_BIT & 1)


@dataclasses.dataclass(frozen=True)
class Container:
    kind: str | None          # "kubernetes", "docker", "podman", ...; None on the host
    evidence: tuple[Evidence, ...]


def detect_container(ctx: DoctorContext) -> Container:
    """Whether the doctor runs in a container, and which kind, from the usual markers."""
    evidence = []
    kind = None
    cgroup = ctx.root.read(INIT_CGROUP_FILE) or ""
    for marker, runtime in CGROUP_RUNTIME_MARKERS:
        if marker in cgroup:
            kind = kind or runtime
            evidence.append(Evidence(INIT_CGROUP_FILE, f"mentions {marker}"))
            break
    for path, runtime in (("/.dockerenv", "docker"), ("/run/.containerenv", "podman")):
        if ctx.root.exists(path):
            kind = kind or runtime
            evidence.append(Evidence(path, "present"))
    if "KUBERNETES_SERVICE_HOST" in ctx.environ:
        # A pod's runtime may be docker or containerd; the fix belongs in the pod spec.
        kind = "kubernetes"
        evidence.append(Evidence("environment KUBERNETES_SERVICE_HOST", ctx.environ["KUBERNETES_SERVICE_HOST"]))
    return Container(kind, tuple(evidence))


def memlock_fix(container: Container) -> str:
    if container.kind == "kubernetes":
        return KUBERNETES_FIX
    if container.kind is not None:
        return DOCKER_FIX
    return HOST_FIX


# ---- findings ---------------------------------------------------------------


def container_finding(container: Container) -> Finding:
    return finding(
        id="memlock.container",
        status=Status.INFO,
        summary=f"running in a {container.kind} container" if container.kind else "not running in a container",
        evidence=container.evidence or (Evidence("/.dockerenv, /proc/1/cgroup, KUBERNETES_SERVICE_HOST", "none"),),
    )


def capability_finding(cap_eff: int | None) -> Finding:
    if cap_eff is None:
        return finding(id="memlock.cap_ipc_lock", status=Status.SKIP,
                       summary="effective capabilities could not be read",
                       evidence=(Evidence(STATUS_FILE + " CapEff", "absent"),))
    held = has_ipc_lock(cap_eff)
    return finding(
        id="memlock.cap_ipc_lock",
        status=Status.INFO,
        summary=f"CAP_IPC_LOCK is {'in' if held else 'not in'} the effective set",
        evidence=(Evidence(STATUS_FILE + " CapEff", f"{cap_eff:016x}"),),
    )


def limit_finding(limits: tuple[str, str] | None, cap_eff: int | None, container: Container) -> Finding:
    if limits is None:
        return finding(id="memlock.limit", status=Status.SKIP, summary="RLIMIT_MEMLOCK could not be read",
                       evidence=(Evidence(LIMITS_FILE, "no 'Max locked memory' line"),))
    soft, hard = limits
    evidence = (Evidence(LIMITS_FILE + " Max locked memory", f"soft {soft}, hard {hard}"),)
    need = format_mib(PROBE_MEMLOCK_BYTES)
    if limit_bytes(soft) >= PROBE_MEMLOCK_BYTES:
        return finding(id="memlock.limit", status=Status.OK,
                       summary=f"memlock soft limit {soft} covers the {need} the probe pins", evidence=evidence)
    if cap_eff is not None and has_ipc_lock(cap_eff):
        return finding(id="memlock.limit", status=Status.OK,
                       summary=f"memlock soft limit {soft} is below {need}, but CAP_IPC_LOCK lifts it",
                       evidence=evidence)
    if limit_bytes(hard) >= PROBE_MEMLOCK_BYTES:
        return finding(id="memlock.limit", status=Status.WARN,
                       summary=f"memlock soft limit {soft} is below the {need} the probe pins; the hard limit allows it",
                       evidence=evidence,
                       fix=f"Raise the soft limit in the launching shell (`ulimit -l {hard}`); to make it stick: "
                           + memlock_fix(container))
    return finding(id="memlock.limit", status=Status.FAIL,
                   summary=f"memlock limit (soft {soft}, hard {hard}) is below the {need} the probe pins and "
                           "CAP_IPC_LOCK is not held: ibv_reg_mr and ibv_create_qp will fail",
                   evidence=evidence, fix=memlock_fix(container))


def check(ctx: DoctorContext) -> list[Finding]:
    container = detect_container(ctx)
    cap_eff = effective_capabilities(ctx.root)
    return [
        limit_finding(memlock_limits(ctx.root), cap_eff, container),
        capability_finding(cap_eff),
        container_finding(container),
    ]
