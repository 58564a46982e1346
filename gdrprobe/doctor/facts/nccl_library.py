"""The libnccl the job will load, found without loading it, and its version.

A job asks the dynamic loader for ``libnccl.so.2`` (NCCL's soname, ``makefiles/common.mk``),
usually from a library whose RUNPATH names the NCCL wheel of its Python (PyTorch's
``nvidia-nccl-cu12``/``-cu13``, in ``site-packages/nvidia/nccl/lib``). The loader looks, in
this order (glibc's ld.so(8)): LD_PRELOAD, LD_LIBRARY_PATH, the RUNPATH (the wheel; a conda
environment's ``lib``), ``/etc/ld.so.cache``, then its default directories (Debian and
Ubuntu's ``libnccl2`` in ``/usr/lib/<arch>-linux-gnu``, RHEL's ``libnccl`` in
``/usr/lib64``). The first copy found is the one the job gets; the later ones are shadowed.

``--nccl PATH`` names the library itself, or the job's Python (an interpreter, a virtual
environment, a prefix or a site-packages directory); without it the job's Python is
VIRTUAL_ENV's, CONDA_PREFIX's, then this interpreter's.

The version comes from the file name (``libnccl.so.2.21.5``, what NCCL's build installs),
else the wheel's metadata (``nvidia_nccl_cu12-2.21.5.dist-info``), else the string NCCL
keeps in its bytes for ``strings`` to find ("NCCL version 2.21.5+cuda12.4", ``src/init.cc``
VERSION_STRING). Every file is read through the root, so a capture keeps what was read; a
version read from the bytes is also captured as a fact, since a capture keeps no whole
library.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import struct
import sys
from collections.abc import Mapping

from gdrprobe.nccl.versions import NcclRules, parse_version
from gdrprobe.report.model import NcclLibrary
from gdrprobe.sysroot import SysRoot

SONAME = "libnccl.so.2"
WHEEL_DIR = "nvidia/nccl/lib"
LD_SO_CACHE = "/etc/ld.so.cache"
# glibc's trusted directories: Debian/Ubuntu multiarch, then RHEL's lib64, then the plain ones.
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
PACKAGE_DIRS = {"/usr/lib/x86_64-linux-gnu": "Debian/Ubuntu's libnccl2",
                "/usr/lib/aarch64-linux-gnu": "Debian/Ubuntu's libnccl2", "/usr/lib64": "RHEL's libnccl"}
SITE_PATTERNS = ("lib/python3*/site-packages", "lib64/python3*/site-packages",
                 "local/lib/python3*/dist-packages", "lib/python3/dist-packages")
VERSIONED_NAME = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")
WHEEL_METADATA = re.compile(r"nvidia_nccl_cu\d+-(\d+\.\d+\.\d+)[^/]*\.dist-info$")
VERSION_MARK = b"NCCL version "
VERSION_TEXT = 32                # "2.21.5+cuda12.4" and its NUL fit
SCAN_CHUNK = 8 << 20
SCAN_LIMIT = 2 << 30             # NCCL's libraries are a few hundred MiB
CACHE_MAGIC = b"glibc-ld.so.cache1.1"
CACHE_HEADER = 48                # struct cache_file_new up to its entries (glibc dl-cache.h)
CACHE_ENTRY = 24                 # struct file_entry_new: flags, key, value, osversion, hwcap


# ---- where the job's Python keeps its packages ---------------------------------------------


def this_python_sites() -> list[str]:
    """The running interpreter's site-packages (``gdrprobe.check()`` runs in the job's Python)."""
    return [path for path in sys.path if path.endswith(("site-packages", "dist-packages"))]


def python_sites(root: SysRoot, start: str) -> list[str]:
    """The site-packages directories of the Python a path names: an interpreter
    (``bin/python3``), a prefix (a virtual environment, a conda environment, /usr), or a
    site-packages directory itself."""
    if posixpath.basename(start.rstrip("/")) in ("site-packages", "dist-packages"):
        return [start]
    prefix = start
    if not root.listdir(start):                  # a file: an interpreter in PREFIX/bin
        prefix = posixpath.dirname(posixpath.dirname(start))
    return [site for pattern in SITE_PATTERNS for site in matching(root, prefix, pattern)]


def matching(root: SysRoot, prefix: str, pattern: str) -> list[str]:
    """A glob under the root, each step through :meth:`SysRoot.listdir` (so a capture keeps it)."""
    found = [prefix]
    for part in pattern.split("/"):
        found = [posixpath.join(base, name) for base in found for name in root.listdir(base)
                 if fnmatch.fnmatchcase(name, part)]
    return found


def job_pythons(root: SysRoot, environ: Mapping[str, str], hint: str | None,
                this_python: list[str]) -> list[tuple[list[str], str]]:
    """(site-packages directories, whose) of the job's Python, in the order they count."""
    if hint and not is_library(hint):
        return [(python_sites(root, hint), f"the Python at {hint} (--nccl)")]
    found = [(python_sites(root, environ[name]), f"the Python at {environ[name]} ({name})")
             for name in ("VIRTUAL_ENV", "CONDA_PREFIX") if environ.get(name)]
    return found + [(this_python, "this Python (gdrprobe's own interpreter)")]


def is_library(path: str) -> bool:
    return posixpath.basename(path).startswith("libnccl")


# ---- the loader's order -----------------------------------------------------------------------


def in_dirs(root: SysRoot, directories: list[str], source: str) -> list[tuple[str, str]]:
    """The soname in each directory that has it, with ``source`` ("{dir}": the directory)."""
    found = []
    for directory in directories:
        path = posixpath.join(directory, SONAME)
        if directory and root.exists(path):
            found.append((path, source.replace("{dir}", directory)))
    return found


def ld_cache_paths(data: bytes | None) -> list[str]:
    """The paths /etc/ld.so.cache gives for the soname, in its order (glibc's format 1.1,
    alone or after the old "ld.so-1.7.0" table; string offsets count from its header)."""
    start = (data or b"").find(CACHE_MAGIC)
    if start < 0 or len(data) < start + CACHE_HEADER:
        return []
    (count,) = struct.unpack_from("<I", data, start + len(CACHE_MAGIC))
    found = []
    for index in range(count):
        offset = start + CACHE_HEADER + index * CACHE_ENTRY
        if offset + CACHE_ENTRY > len(data):
            break
        _flags, key, value = struct.unpack_from("<iII", data, offset)
        if c_string(data, start + key) == SONAME:
            found.append(c_string(data, start + value))
    return found


def c_string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    return data[offset:end if end >= 0 else len(data)].decode("utf-8", "replace")


def package_note(path: str) -> str:
    owner = PACKAGE_DIRS.get(posixpath.dirname(path))
    return f" ({owner} installs it there)" if owner else ""


def candidates(root: SysRoot, environ: Mapping[str, str], hint: str | None,
               this_python: list[str]) -> list[tuple[str, str]]:
    """Every copy of the library the job could get, first the one it gets, with where each
    came from."""
    if hint and is_library(hint):
        return [(hint, "--nccl")] if root.exists(hint) else []
    found = [(entry, "LD_PRELOAD") for entry in environ.get("LD_PRELOAD", "").replace(":", " ").split()
             if is_library(entry) and root.exists(entry)]
    found += in_dirs(root, environ.get("LD_LIBRARY_PATH", "").split(":"), "LD_LIBRARY_PATH ({dir})")
    if hint:
        found += in_dirs(root, [hint], "the directory --nccl names")
    for sites, whose in job_pythons(root, environ, hint, this_python):
        found += in_dirs(root, [posixpath.join(site, WHEEL_DIR) for site in sites], f"the NCCL wheel of {whose}")
    if environ.get("CONDA_PREFIX"):
        found += in_dirs(root, [environ["CONDA_PREFIX"] + "/lib"], "the conda environment's lib (CONDA_PREFIX)")
    found += [(path, LD_SO_CACHE + package_note(path)) for path in ld_cache_paths(root.read_bytes(LD_SO_CACHE, 1 << 20))
              if root.exists(path)]
    # glibc elf/dl-load.c _dl_map_object: the default directories come last whenever the
    # cache gave nothing, also when a cache exists that does not list the soname.
    found += [(path, "the loader's default directories" + package_note(path))
              for path, _ in in_dirs(root, list(DEFAULT_DIRS), "")]
    first: dict[str, str] = {}
    for path, source in found:
        first.setdefault(path, source)
    return list(first.items())


# ---- the version ------------------------------------------------------------------------------


def wheel_version(root: SysRoot, path: str) -> tuple[str, str] | None:
    """The version of the nvidia-nccl wheel that installed ``path``: its dist-info's name,
    the one whose RECORD lists the library when several are there."""
    lib_dir = posixpath.dirname(path)
    if not lib_dir.endswith("/" + WHEEL_DIR):
        return None
    site = lib_dir[:-len(WHEEL_DIR) - 1]
    wheels = [(name, match.group(1)) for name in root.listdir(site) if (match := WHEEL_METADATA.match(name))]
    relative = posixpath.relpath(path, site)
    owners = [(name, version) for name, version in wheels
              if relative in (root.read(f"{site}/{name}/RECORD") or "")] or wheels
    return (owners[0][1], f"the wheel's metadata {site}/{owners[0][0]}") if owners else None


def version_in_bytes(root: SysRoot, path: str) -> str | None:
    """The "NCCL version x.y.z+cudaX.Y" string in the library's bytes, read in chunks."""
    try:
        handle = root.open(path)
    except OSError:
        return None
    tail, scanned = b"", 0
    with handle:
        while scanned < SCAN_LIMIT:
            chunk = handle.read(SCAN_CHUNK)
            window = tail + chunk
            at = window.find(VERSION_MARK)
            if at >= 0 and (not chunk or at + len(VERSION_MARK) + VERSION_TEXT <= len(window)):
                text = window[at + len(VERSION_MARK):at + len(VERSION_MARK) + VERSION_TEXT].split(b"\0")[0]
                return text.decode("ascii", "replace")
            if not chunk:
                return None
            tail, scanned = window[-(len(VERSION_MARK) + VERSION_TEXT):], scanned + len(chunk)
    return None


def read_version(root: SysRoot, path: str, captured: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    """(version, how it was read, the bytes' string when that is how)."""
    name = posixpath.basename(root.realpath(path))
    match = VERSIONED_NAME.search(name)
    if match:
        return match.group(1), f"the file name {name}", None
    wheel = wheel_version(root, path)
    if wheel:
        return wheel[0], wheel[1], None
    text = version_in_bytes(root, path) or captured.get(path)
    version = parse_version(text)
    if version is None:
        return None, None, None
    return ".".join(map(str, version)), f"the library's bytes (\"NCCL version {text}\")", text


def find_nccl_library(root: SysRoot, environ: Mapping[str, str], hint: str | None, this_python: list[str],
                      captured: Mapping[str, str]) -> tuple[NcclLibrary, dict[str, str]]:
    """The library the job will load (or where none was found), and the versions read from
    bytes (path -> string) for a capture to keep."""
    found = candidates(root, environ, hint, this_python)
    if not found:
        looked = ("the path --nccl names" if hint and is_library(hint) else
                  "LD_PRELOAD, LD_LIBRARY_PATH, the job's Python's NCCL wheel, CONDA_PREFIX, "
                  f"{LD_SO_CACHE} and the loader's default directories")
        return NcclLibrary(None, None, f"looked in {looked}", None,
                           differences=NcclRules().differences()), {}
    (path, source), others = found[0], found[1:]
    version, how, text = read_version(root, path, captured)
    rules = NcclRules(parse_version(version))
    library = NcclLibrary(path, version, source, how,
                          shadowed=tuple(f"{other} ({where})" for other, where in others),
                          differences=rules.differences())
    return library, ({path: text} if text else {})

