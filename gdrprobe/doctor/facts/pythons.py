"""The Pythons a job could run on a machine, and where each keeps its packages.

The NCCL a job loads depends on the Python that runs it (its torch, its wheels), and the
doctor is often not run by that Python. ``--nccl PATH`` names it: an interpreter, a virtual
environment or prefix, or a site-packages directory. Without it the candidates are, in the
order the default is taken from: ``VIRTUAL_ENV``'s, ``CONDA_PREFIX``'s, gdrprobe's own
interpreter, then the machine's, looked for in ``MACHINE_PREFIXES`` only (the system's, the
official Python images' ``/usr/local``, conda installs and their environments, virtual
environments in ``/opt`` and the usual container places; no home directory is crawled), at
most ``MAX_PYTHONS``. One Python per prefix: its site-packages for every ``python3.X`` there.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import posixpath
import sys
from collections.abc import Mapping

from gdrprobe.sysroot import SysRoot

# A prefix's site-packages in the order its interpreter's sys.path has them (Debian and
# Ubuntu: /usr/local/lib/python3.X/dist-packages, /usr/lib/python3/dist-packages; RHEL:
# lib64 before lib, /usr/local's first; a venv, conda: lib/python3.X/site-packages).
SITE_PATTERNS = ("local/lib64/python3.*/site-packages", "local/lib/python3.*/site-packages",
                 "local/lib/python3.*/dist-packages", "lib64/python3.*/site-packages",
                 "lib/python3.*/site-packages", "lib/python3/dist-packages", "lib/python3.*/dist-packages")
MACHINE_PREFIXES = ("/usr", "/usr/local", "/opt/conda", "/opt/conda/envs/*", "/opt/*", "/opt/*/envs/*",
                    "/opt/*/.venv", "/opt/*/venv", "/venv", "/.venv", "/root/.venv", "/root/venv",
                    "/app/.venv", "/workspace/.venv")
MAX_PYTHONS = 32
SITE_NAMES = ("site-packages", "dist-packages")


@dataclasses.dataclass(frozen=True)
class Python:
    """One Python: how the report names it, its site-packages (sys.path order), its
    interpreter (the executable whose DT_RPATH counts) and its prefix."""

    name: str
    sites: tuple[str, ...]
    executable: str | None = None
    conda_lib: str | None = None     # a conda prefix's lib/, where conda's packages put libraries


def this_python() -> dict:
    """The running interpreter's site-packages and executable, as a capture keeps them
    (``gdrprobe.check()`` runs in the job's Python)."""
    return {"site_packages": [path for path in sys.path if path.endswith(SITE_NAMES)],
            "executable": os.path.realpath(sys.executable) if sys.executable else None}


def matching(root: SysRoot, prefix: str, pattern: str) -> list[str]:
    """A glob under the root, each step through :meth:`SysRoot.listdir` (so a capture keeps it)."""
    found = [prefix]
    for part in [p for p in pattern.split("/") if p]:
        found = [posixpath.join(base, name) for base in found for name in root.listdir(base)
                 if fnmatch.fnmatchcase(name, part)]
    return found


def prefix_sites(root: SysRoot, prefix: str) -> tuple[str, ...]:
    """A prefix's site-packages, each real directory once (a venv's lib64 is a link to lib)."""
    seen: dict[str, str] = {}
    for pattern in SITE_PATTERNS:
        for site in matching(root, prefix, pattern):
            seen.setdefault(root.resolve(site), site)
    return tuple(seen.values())


def python_at(root: SysRoot, start: str, name: str) -> Python:
    """The Python a path names: an interpreter (``PREFIX/bin/python3``), a prefix (a virtual
    or conda environment, /usr), or a site-packages directory itself."""
    start = start.rstrip("/") or "/"
    if posixpath.basename(start) in SITE_NAMES:
        return Python(name, (start,))
    if root.listdir(start):
        prefix, executable = start, posixpath.join(start, "bin/python3")
        executable = executable if root.exists(executable) else None
    else:
        prefix, executable = posixpath.dirname(posixpath.dirname(start)), start
    conda = root.exists(prefix + "/conda-meta")
    return Python(name, prefix_sites(root, prefix), executable, prefix + "/lib" if conda else None)


def machine_pythons(root: SysRoot) -> list[Python]:
    """The Pythons found in ``MACHINE_PREFIXES``, at most ``MAX_PYTHONS``."""
    found: list[Python] = []
    prefixes = dict.fromkeys(path for pattern in MACHINE_PREFIXES for path in matching(root, "/", pattern))
    for prefix in prefixes:
        python = python_at(root, prefix, f"the Python at {prefix} ({prefix_kind(root, prefix)})")
        if python.sites:
            found.append(python)
        if len(found) == MAX_PYTHONS:
            break
    return found


def prefix_kind(root: SysRoot, prefix: str) -> str:
    if root.exists(prefix + "/conda-meta"):
        return "conda"
    if root.exists(prefix + "/pyvenv.cfg"):
        return "virtual environment"
    return "system" if prefix.startswith("/usr") else "prefix"


def candidate_pythons(root: SysRoot, environ: Mapping[str, str], this: Mapping) -> list[Python]:
    """Every Python the job could be run by, in the order the default is taken from; one
    whose site-packages all belong to an earlier one is that one (the first name is kept).
    ``this``: :func:`this_python`'s."""
    found = [python_at(root, environ[name], f"the Python at {environ[name]} ({name})")
             for name in ("VIRTUAL_ENV", "CONDA_PREFIX") if environ.get(name)]
    if this.get("site_packages"):
        found.append(Python("this Python (gdrprobe's own interpreter)", tuple(this["site_packages"]),
                            this.get("executable")))
    found += machine_pythons(root)
    unique: list[Python] = []
    seen: set[str] = set()
    for python in found:
        if not seen.issuperset(python.sites):
            unique.append(python)
            seen.update(python.sites)
    return unique

