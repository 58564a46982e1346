"""Compile the stand-in libmlx5.so.1 (standin.c, libmlx5.map) at test time, into a directory
named after a hash of its sources under the system's temporary directory. Load it by path
(:class:`gdrprobe.rdma.mlx5dv.Mlx5dv`'s ``libmlx5``) or put the directory first on
LD_LIBRARY_PATH. Call shapes and NCCL's order, not a ConnectX."""

from __future__ import annotations

import pathlib

from tests.standin_build import build_once

HERE = pathlib.Path(__file__).parent
SOURCE, VERSION_SCRIPT = HERE / "standin.c", HERE / "libmlx5.map"
LIBRARY = "libmlx5.so.1"


def build() -> pathlib.Path:
    """The compiled stand-in's path; compiled once per source."""
    return build_once("mlx5", LIBRARY, (SOURCE, VERSION_SCRIPT),
                      [f"-Wl,--version-script={VERSION_SCRIPT}", "-Wl,-soname," + LIBRARY,
                       str(SOURCE), "-ldl"]) / LIBRARY
