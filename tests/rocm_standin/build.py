"""Compile the stand-in HIP runtime and HSA (standin.c) at first use, as
tests/cuda_standin/build.py does the stand-in libcuda.so.1: one directory per source, under
the system's temporary directory, holding it as libamdhip64.so (what hip-python opens) and
libhsa-runtime64.so (what gdrprobe.memory.rocm and RCCL open), one file. Not GPU proof."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).parent
SOURCE = HERE / "standin.c"
# The lab's dma-buf exporter interface, which the stand-in exports through where it is loaded.
EXPORTER_HEADER = HERE.parent.parent / "lab" / "dmabuf" / "gdr_dmabuf_uapi.h"
LIBRARIES = ("libamdhip64.so", "libhsa-runtime64.so")
COMPILE_TIMEOUT_S = 120


def build() -> pathlib.Path:
    """The directory holding the compiled stand-in under both names; compiled once per source."""
    digest = hashlib.sha256(SOURCE.read_bytes() + EXPORTER_HEADER.read_bytes()).hexdigest()[:16]
    directory = pathlib.Path(tempfile.gettempdir()) / f"gdrprobe-rocm-standin-{digest}"
    if all((directory / name).exists() for name in LIBRARIES):
        return directory
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the stand-in HIP runtime")
    directory.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a concurrent run never loads half a file.
    partial = directory / f"standin.so.{os.getpid()}"
    subprocess.run([compiler, "-std=gnu11", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-O1",
                    f"-I{EXPORTER_HEADER.parent}", "-o", str(partial), str(SOURCE)],
                   check=True, timeout=COMPILE_TIMEOUT_S)
    partial.rename(directory / LIBRARIES[0])
    # One object under both names: glibc maps a file it has loaded once (same device and
    # inode), so HSA's export finds the allocations hipMalloc made.
    for name in LIBRARIES[1:]:
        link = directory / f"{name}.{os.getpid()}"
        link.symlink_to(LIBRARIES[0])
        link.rename(directory / name)
    return directory


def environment(base: dict | None = None) -> dict:
    """os.environ (or base) with the stand-in first on LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    path = [str(build())] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    env["LD_LIBRARY_PATH"] = ":".join(path)
    return env
