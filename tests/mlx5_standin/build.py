"""Compile the stand-in libmlx5.so.1 (standin.c, libmlx5.map) at test time, into a directory
named after a hash of its sources under the system's temporary directory. Load it by path
(:class:`gdrprobe.rdma.mlx5dv.Mlx5dv`'s ``libmlx5``) or put the directory first on
LD_LIBRARY_PATH. Call shapes and NCCL's order, not a ConnectX."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).parent
SOURCE, VERSION_SCRIPT = HERE / "standin.c", HERE / "libmlx5.map"
LIBRARY = "libmlx5.so.1"


def build() -> pathlib.Path:
    """The compiled stand-in's path; compiled once per source."""
    digest = hashlib.sha256(SOURCE.read_bytes() + VERSION_SCRIPT.read_bytes()).hexdigest()[:16]
    directory = pathlib.Path(tempfile.gettempdir()) / f"gdrprobe-mlx5-standin-{digest}"
    library = directory / LIBRARY
    if library.exists():
        return library
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the stand-in libmlx5.so.1")
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"{LIBRARY}.{os.getpid()}"
    subprocess.run([compiler, "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    f"-Wl,--version-script={VERSION_SCRIPT}", "-Wl,-soname," + LIBRARY,
                    "-o", str(partial), str(SOURCE), "-ldl"], check=True, timeout=120)
    partial.rename(library)
    return library
