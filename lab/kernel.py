"""Fetch Debian's kernel (which ships rdma_rxe) once, without installing it."""

from __future__ import annotations

import glob
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("GDRPROBE_LAB_CACHE", os.path.join(REPO, ".lab-cache"))
META_PACKAGE = "linux-image-amd64"   # the -cloud-amd64 flavour has no rdma_rxe
STEP_TIMEOUT_S = 600                 # apt over a slow mirror, or unpacking 70 MB


class LabError(RuntimeError):
    """The lab could not be set up or a guest failed to boot."""


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """One set-up step, bounded: a mirror that stops answering ends it with its name."""
    try:
        return subprocess.run(argv, timeout=STEP_TIMEOUT_S, **kwargs)
    except subprocess.TimeoutExpired as error:
        raise LabError(f"'{' '.join(argv)}' did not end within {STEP_TIMEOUT_S} s: "
                       "is the Debian mirror reachable?") from error


def kernel_package() -> str:
    """The versioned image package that Debian's kernel meta-package points at now (the
    package lists are refreshed once if they do not know it)."""
    for attempt in range(2):
        out = run(["apt-cache", "depends", META_PACKAGE], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            name = line.split(":", 1)[-1].strip()
            if line.strip().startswith("Depends:") and name.startswith("linux-image-"):
                return name
        if attempt == 0:
            run(["apt-get", "update", "-q"], capture_output=True)
    raise LabError(f"apt-cache does not know {META_PACKAGE} even after 'apt-get update'")


def cached_kernel() -> str | None:
    """A kernel image already unpacked in the cache, whatever its version."""
    images = sorted(glob.glob(os.path.join(CACHE, "kernel", "*", "boot", "vmlinuz-*")))
    return images[-1] if images else None


def ensure_kernel() -> str:
    """Path of a vmlinuz whose modules sit beside it; downloads (about 70 MB) once."""
    image = cached_kernel()
    if image:
        return image
    package = kernel_package()
    target = os.path.join(CACHE, "kernel", package)
    downloads = os.path.join(CACHE, "downloads")
    os.makedirs(downloads, exist_ok=True)
    # apt drops privileges to _apt for downloads; a world-writable folder keeps it quiet.
    os.chmod(downloads, 0o777)
    result = run(["apt-get", "download", package], cwd=downloads, capture_output=True, text=True)
    debs = glob.glob(os.path.join(downloads, f"{package}_*.deb"))
    if result.returncode != 0 or not debs:
        raise LabError(f"apt-get download {package} failed: {result.stderr.strip()}")
    partial = target + ".partial"
    run(["rm", "-rf", partial], check=True)
    os.makedirs(partial)
    run(["dpkg-deb", "-x", debs[0], partial], check=True)
    os.rename(partial, target)
    os.remove(debs[0])
    image = cached_kernel()
    if not image:
        raise LabError(f"{package} holds no boot/vmlinuz-*")
    return image
