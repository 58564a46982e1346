"""Compile the stand-in HIP runtime and HSA (standin.c) at first use, as
tests/cuda_standin/build.py does the stand-in libcuda.so.1: one directory per source, under
the system's temporary directory, holding it as libamdhip64.so (what hip-python opens) and
libhsa-runtime64.so (what gdrprobe.memory.rocm and RCCL open), one file. Not GPU proof."""

from __future__ import annotations

import os
import pathlib

from tests.standin_build import build_once

HERE = pathlib.Path(__file__).parent
SOURCE = HERE / "standin.c"
# The lab's dma-buf exporter interface, which the stand-in exports through where it is loaded.
EXPORTER_HEADER = HERE.parent.parent / "lab" / "dmabuf" / "gdr_dmabuf_uapi.h"
LIBRARIES = ("libamdhip64.so", "libhsa-runtime64.so")


def build() -> pathlib.Path:
    """The directory holding the compiled stand-in under both names; compiled once per source."""
    directory = build_once("rocm", LIBRARIES[0], (SOURCE, EXPORTER_HEADER),
                           [f"-I{EXPORTER_HEADER.parent}", str(SOURCE)])
    # One object under both names: glibc maps a file it has loaded once (same device and
    # inode), so HSA's export finds the allocations hipMalloc made.
    for name in LIBRARIES[1:]:
        if not (directory / name).exists():
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
