"""Where glibc's dynamic loader finds a library an object asks for, read without loading it.

glibc 2.42 ``elf/dl-load.c`` (_dl_map_object, _dl_map_new_object), for a DT_NEEDED name
without a slash, asked for by the loading object L:

1. an object already loaded whose soname is the name (_dl_lookup_map): LD_PRELOAD's, or one a
   program opened first (the caller handles those);
2. only when L has no DT_RUNPATH: L's DT_RPATH, then the DT_RPATH of the object that loaded L
   and so on up, then the executable's DT_RPATH;
3. LD_LIBRARY_PATH (split at ``:`` and ``;``);
4. L's own DT_RUNPATH (never its loaders': a RUNPATH is not inherited);
5. ``/etc/ld.so.cache`` (_dl_load_cache_lookup), then the default directories; with
   DF_1_NODEFLIB on L neither the defaults nor a cache entry in them.

``$ORIGIN`` (or ``${ORIGIN}``) in a search path is the directory of the object as it was
opened (``elf/dl-object.c`` _dl_new_object: its name, links not resolved), for the
executable the directory of ``/proc/self/exe`` (links resolved); ``_dl_dst_substitute``.
An entry naming ``$LIB`` or ``$PLATFORM`` is dropped here (their values are the loader
build's), as are empty entries and relative directories (the job's working directory). The
loader also tries ``glibc-hwcaps`` subdirectories and skips a file of another ELF class;
neither is modelled (no libnccl ships that way).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import struct
from collections.abc import Mapping

from gdrprobe.doctor.facts.elf_dynamic import Dynamic
from gdrprobe.sysroot import SysRoot

LD_SO_CACHE = "/etc/ld.so.cache"
CACHE_LIMIT = 1 << 20
# glibc's trusted directories: Debian/Ubuntu multiarch, then RHEL's lib64, then the plain ones.
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
CACHE_MAGIC = b"glibc-ld.so.cache1.1"
CACHE_HEADER = 48                # struct cache_file_new up to its entries (glibc dl-cache.h)
CACHE_ENTRY = 24                 # struct file_entry_new: flags, key, value, osversion, hwcap
ORIGIN = re.compile(r"\$(ORIGIN\b|\{ORIGIN\})")
OTHER_TOKEN = re.compile(r"\$(LIB|PLATFORM)\b|\$\{(LIB|PLATFORM)\}")


@dataclasses.dataclass(frozen=True)
class LoadingObject:
    """An object that asks the loader for libraries: its path as opened, its dynamic section."""

    path: str
    dynamic: Dynamic
    executable: bool = False     # the program itself: $ORIGIN is its real directory

    def origin(self, root: SysRoot) -> str:
        return posixpath.dirname(root.resolve(self.path) if self.executable else self.path)


def search_path(entries: str | None, origin: str) -> list[tuple[str, str]]:
    """(directory, the entry as written) of a DT_RPATH or DT_RUNPATH, $ORIGIN expanded
    (glibc fillin_rpath splits at colons only)."""
    found = []
    for entry in (entries or "").split(":"):
        if entry and not OTHER_TOKEN.search(entry):
            found.append((posixpath.normpath(ORIGIN.sub(lambda _: origin, entry)), entry))
    return found


def places(root: SysRoot, loader: LoadingObject | None, executable: LoadingObject | None,
           environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(directory, rule) the loader tries before its cache, in glibc's order, for a name
    ``loader`` asks for; ``executable``: the program (its DT_RPATH counts too)."""
    found: list[tuple[str, str]] = []
    if loader is None or loader.dynamic.runpath is None:
        for obj in (loader, executable):
            if obj is not None and obj.dynamic.rpath:
                found += [(directory, f"DT_RPATH of {obj.path} ({entry})")
                          for directory, entry in search_path(obj.dynamic.rpath, obj.origin(root))]
    found += [(directory, f"LD_LIBRARY_PATH ({directory})")
              for directory in re.split("[:;]", environ.get("LD_LIBRARY_PATH", "")) if directory]
    if loader is not None and loader.dynamic.runpath:
        found += [(directory, f"DT_RUNPATH of {loader.path} ({entry})")
                  for directory, entry in search_path(loader.dynamic.runpath, loader.origin(root))]
    # A relative directory is the job's working directory's, which is not known here.
    return [(directory, rule) for directory, rule in found if directory.startswith("/")]


def resolve(root: SysRoot, soname: str, tried: list[tuple[str, str]], nodeflib: bool = False,
            owner=lambda path: "") -> list[tuple[str, str]]:
    """Every copy of ``soname`` in the loader's order after ``tried`` (directory, rule):
    its cache, then its default directories; first the one it loads. ``owner(path)`` adds
    who installs a file there."""
    found = [(posixpath.join(directory, soname), rule) for directory, rule in tried
             if root.exists(posixpath.join(directory, soname))]
    cached = ld_cache_paths(root.read_bytes(LD_SO_CACHE, CACHE_LIMIT), soname)
    found += [(path, LD_SO_CACHE + owner(path)) for path in cached
              if root.exists(path) and not (nodeflib and posixpath.dirname(path) in DEFAULT_DIRS)]
    # _dl_map_new_object tries the default directories whenever the cache gave nothing, also
    # when a cache exists that does not list the name.
    if not nodeflib:
        found += [(posixpath.join(directory, soname), "the loader's default directories" + owner(
            posixpath.join(directory, soname))) for directory in DEFAULT_DIRS
            if root.exists(posixpath.join(directory, soname))]
    first: dict[str, str] = {}
    for path, rule in found:
        first.setdefault(path, rule)
    return list(first.items())


def ld_cache_paths(data: bytes | None, soname: str) -> list[str]:
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
        if c_string(data, start + key) == soname:
            found.append(c_string(data, start + value))
    return found


def c_string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    return data[offset:end if end >= 0 else len(data)].decode("utf-8", "replace")
