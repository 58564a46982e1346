"""Fixture libnccl installs, laid out as each installer lays them out: NCCL's own build
(libnccl.so.2 -> libnccl.so.2.X.Y, makefiles/common.mk; Debian's libnccl2 and RHEL's libnccl
ship that), the nvidia-nccl-cuXX wheel (site-packages/nvidia/nccl/lib/libnccl.so.2 and its
dist-info), and glibc's /etc/ld.so.cache (format 1.1, optionally after the old table)."""

from __future__ import annotations

import os
import struct

from tests.unit.doctor import machines

CACHE_FLAGS_X86_64 = 0x0303       # FLAG_ELF_LIBC6 | FLAG_X8664_LIB64 (glibc dl-cache.h)


def library_bytes(version: str | None) -> bytes:
    """An ELF-looking file with the string NCCL keeps for `strings` (src/init.cc VERSION_STRING)."""
    text = b"" if version is None else b"NCCL version " + version.encode() + b"\0"
    return b"\x7fELF" + b"\0" * 4096 + text + b"\0" * 4096


def built_library(tree: machines.SysfsTree, directory: str, version: str) -> str:
    """libnccl.so.2 -> libnccl.so.2.X.Y in ``directory``, as `make install` and the distro
    packages leave it; returns the soname's path."""
    tree.write(f"{directory}/libnccl.so.{version}", library_bytes(version + "+cuda12.4"))
    os.symlink(f"libnccl.so.{version}", tree.path(f"{directory}/libnccl.so.2"))
    return f"{directory}/libnccl.so.2"


def wheel(tree: machines.SysfsTree, site: str, version: str, cuda: int = 12, in_bytes: bool = True) -> str:
    """The nvidia-nccl-cuXX wheel in ``site``; returns the library's path."""
    path = f"{site}/nvidia/nccl/lib/libnccl.so.2"
    tree.write(path, library_bytes(f"{version}+cuda{cuda}.4" if in_bytes else None))
    info = f"{site}/nvidia_nccl_cu{cuda}-{version}.dist-info"
    tree.write(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: nvidia-nccl-cu{cuda}\nVersion: {version}\n")
    tree.write(f"{info}/RECORD", "nvidia/nccl/lib/libnccl.so.2,sha256=x,1\n")
    return path


def ld_so_cache(entries: list[tuple[str, str]], old_table: bool = False) -> bytes:
    """/etc/ld.so.cache in glibc's format 1.1 (struct cache_file_new, file_entry_new); string
    offsets count from its header."""
    base = 48 + 24 * len(entries)
    strings, packed = b"", b""
    for key, value in entries:
        key_at = base + len(strings)
        strings += key.encode() + b"\0"
        value_at = base + len(strings)
        strings += value.encode() + b"\0"
        packed += struct.pack("<iIIIQ", CACHE_FLAGS_X86_64, key_at, value_at, 0, 0)
    new = b"glibc-ld.so.cache1.1" + struct.pack("<IIB3xI12x", len(entries), len(strings), 0, 0) + packed + strings
    if not old_table:
        return new
    old = b"ld.so-1.7.0" + struct.pack("<I", 0)
    return old + b"\0" * (-len(old) % 8) + new


# ---- ELF objects with a dynamic section, and torch installs built from them ---------------

LOAD_ADDRESS = 0x400000


def elf_object(needed=(), soname=None, rpath=None, runpath=None, nodeflib=False, padding=0, payload=b"",
               ident=b"\x7fELF\x02\x01\x01") -> bytes:
    """A 64-bit little-endian ELF shared object (Elf64_Ehdr, a PT_LOAD mapping the whole file
    at LOAD_ADDRESS, a PT_DYNAMIC), its strings in a string table after ``padding`` zero
    bytes and ``payload`` (a capture keeps only a file's first MiB)."""
    strings, offsets = b"\0", {}
    for text in (*needed, soname, rpath, runpath):
        if text is not None and text not in offsets:
            offsets[text] = len(strings)
            strings += text.encode() + b"\0"
    strtab = 64 + 2 * 56 + padding + len(payload)
    dynamic_at = strtab + len(strings) + (-(strtab + len(strings)) % 8)
    entries = [(1, offsets[name]) for name in needed]
    entries += [(tag, offsets[text]) for tag, text in ((14, soname), (15, rpath), (29, runpath)) if text is not None]
    entries += [(5, LOAD_ADDRESS + strtab), (10, len(strings))] + ([(0x6FFFFFFB, 0x800)] if nodeflib else [])
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries + [(0, 0)])
    size = dynamic_at + len(dynamic)
    header = struct.pack("<16sHHIQQQIHHHHHH", ident.ljust(16, b"\0"), 3, 62, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    phdrs = (struct.pack("<IIQQQQQQ", 1, 5, 0, LOAD_ADDRESS, LOAD_ADDRESS, size, size, 0x1000)
             + struct.pack("<IIQQQQQQ", 2, 6, dynamic_at, LOAD_ADDRESS + dynamic_at, LOAD_ADDRESS + dynamic_at,
                           len(dynamic), len(dynamic), 8))
    body = header + phdrs + b"\0" * padding + payload + strings
    return body + b"\0" * (dynamic_at - len(body)) + dynamic


def torch(tree: machines.SysfsTree, site: str, library: str = "libtorch_cuda.so", init: str | None = None,
          global_deps: bytes | None = None, **dynamic) -> str:
    """A torch package in ``site`` whose ``library`` carries ``dynamic`` (needed: libnccl.so.2
    unless given); returns that library's path."""
    dynamic.setdefault("needed", ("libc10_cuda.so", "libnccl.so.2"))
    path = f"{site}/torch/lib/{library}"
    tree.write(path, elf_object(**dynamic))
    tree.write(f"{site}/torch/__init__.py", init or "")
    if global_deps is not None:
        tree.write(f"{site}/torch/lib/libtorch_global_deps.so", global_deps)
    return path
