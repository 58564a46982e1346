"""Compile the stand-in libcuda.so.1 (standin.c, standin_vmm.c) at test time.

Each variant lands in its own directory, named after a hash of the source and the flags,
under the system's temporary directory: put that directory first on LD_LIBRARY_PATH and
the real cuda.bindings load the stand-in instead of a driver. Binding call shapes, not a GPU.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).parent
SOURCES = [HERE / "standin.c", HERE / "standin_vmm.c"]
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
    text = b"".join(path.read_bytes() for path in (*SOURCES, HEADER, EXPORTER_HEADER))
    digest = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]
    directory = pathlib.Path(tempfile.gettempdir()) / f"gdrprobe-cuda-standin-{digest}"
    library = directory / LIBRARY
    if library.exists():
        return directory
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the stand-in libcuda.so.1")
    directory.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a concurrent run never loads half a file.
    partial = directory / f"{LIBRARY}.{os.getpid()}"
    subprocess.run([compiler, "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared",
                    "-fPIC", f"-I{EXPORTER_HEADER.parent}", *flags, "-o", str(partial),
                    *map(str, SOURCES), "-lpthread"],
                   check=True, timeout=120)
    partial.rename(library)
    return directory


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
