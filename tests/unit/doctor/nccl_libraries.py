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
