"""Compile the stand-in libcuda.so.1 (standin.c, standin_vmm.c, standin_host.c) at test time.

Each variant lands in its own directory, named after a hash of the source and the flags,
under the system's temporary directory: put that directory first on LD_LIBRARY_PATH and
the real cuda.bindings load the stand-in instead of a driver. Binding call shapes, not a GPU.
"""

from __future__ import annotations

import os
import pathlib

from tests.standin_build import build_once

HERE = pathlib.Path(__file__).parent
SOURCES = [HERE / "standin.c", HERE / "standin_vmm.c", HERE / "standin_host.c"]
HEADER = HERE / "standin.h"
# The lab's dma-buf exporter interface (lab/dmabuf/gdr_dmabuf_uapi.h), which the stand-in
# exports through where that module is loaded.
EXPORTER_HEADER = HERE.parent.parent / "lab" / "dmabuf" / "gdr_dmabuf_uapi.h"
LIBRARY = "libcuda.so.1"
# A driver older than CUDA 12.0: no cuGetProcAddress_v2 (what cuda-bindings 12.x+ need).
VARIANTS = {"": [], "no-proc-address-v2": ["-DSTANDIN_NO_PROC_ADDRESS_V2"]}


def build(variant: str = "") -> pathlib.Path:
    """The directory holding the compiled stand-in; compiled once per source and flags."""
    flags = VARIANTS[variant]
    return build_once("cuda", LIBRARY, (*SOURCES, HEADER, EXPORTER_HEADER),
                      [f"-I{EXPORTER_HEADER.parent}", *flags, *map(str, SOURCES), "-lpthread"],
                      key=" ".join(flags))


def standin_settings(**settings: str) -> dict[str, str]:
    """GDRPROBE_STANDIN_<KEY>=value for each setting, what standin.c reads when it loads
    (apply_environment): fail="cuInit=802", compute_mode="exclusive-process", ..."""
    return {f"GDRPROBE_STANDIN_{key.upper()}": value for key, value in settings.items()}


def environment(variant: str = "", base: dict | None = None) -> dict:
    """os.environ (or base) with the stand-in first on LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    path = [str(build(variant))] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    env["LD_LIBRARY_PATH"] = ":".join(path)
    return env
