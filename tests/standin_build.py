"""Compiling a stand-in C library (the CUDA driver's, HIP's, libmlx5's) at test time, once
per content: each build lands in a directory named after a hash of its inputs under the
system's temporary directory, which a test puts on LD_LIBRARY_PATH or preloads from."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

COMPILE_TIMEOUT_S = 120
WARNINGS_AS_ERRORS = ("-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC")


def build_once(kind: str, library: str, inputs: Sequence[pathlib.Path],
               arguments: Sequence[str], key: str = "") -> pathlib.Path:
    """The directory holding `library` compiled from `arguments` (sources, flags, libraries);
    its name hashes every input file and `key` (a variant's flags), so each content is
    compiled once however many tests ask."""
    text = b"".join(path.read_bytes() for path in inputs) + key.encode()
    directory = (pathlib.Path(tempfile.gettempdir())
                 / f"gdrprobe-{kind}-standin-{hashlib.sha256(text).hexdigest()[:16]}")
    if (directory / library).exists():
        return directory
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError(f"no C compiler (cc or gcc) to build the stand-in {library}")
    directory.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed, so a concurrent run never loads half a file.
    partial = directory / f"{library}.{os.getpid()}"
    subprocess.run([compiler, *WARNINGS_AS_ERRORS, "-o", str(partial), *arguments],
                   check=True, timeout=COMPILE_TIMEOUT_S)
    partial.rename(directory / library)
    return directory
