"""The dynamic section of a shared object or program, read without loading it.

What the dynamic loader needs to know about an object to find the libraries it asks for:
its DT_NEEDED names, DT_SONAME, DT_RPATH, DT_RUNPATH and DF_1_NODEFLIB in DT_FLAGS_1 (the
tag values are glibc's ``elf/elf.h``, the ELF gABI's). The reader is bounded and linear:
the ELF header, the program headers (at most ``MAX_PHDRS``), the PT_DYNAMIC segment (at most
``MAX_DYNAMIC_BYTES``), then each string it names (at most ``MAX_STRINGS`` of
``MAX_STRING_BYTES``), each a seek and one read through :meth:`SysRoot.open`; a library of a
gigabyte costs a few KiB. Only 64-bit little-endian objects are read (x86_64, aarch64,
ppc64le: every platform NCCL ships for); any other is refused with the reason.
"""

from __future__ import annotations

import dataclasses
import struct

from gdrprobe.sysroot import SysRoot

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
PN_XNUM = 0xFFFF                 # the real count lives elsewhere: refused, no library uses it
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
DT_FLAGS_1 = 0x6FFFFFFB
DF_1_NODEFLIB = 0x800
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")   # Elf64_Ehdr
PHDR = struct.Struct("<IIQQQQQQ")           # Elf64_Phdr
DYN = struct.Struct("<qQ")                  # Elf64_Dyn
MAX_PHDRS = 64
MAX_DYNAMIC_BYTES = 64 << 10
MAX_STRINGS = 256
MAX_STRING_BYTES = 4096
MAX_FILE_OFFSET = (1 << 63) - 1             # an off_t: no byte of a file lies past it


class ElfUnreadable(ValueError):
    """The object's dynamic section cannot be read; the message says why."""


@dataclasses.dataclass(frozen=True)
class Dynamic:
    """What the loader reads from an object's dynamic section (strings as stored: ``$ORIGIN``
    not yet expanded, search paths still joined by colons)."""

    needed: tuple[str, ...] = ()
    soname: str | None = None
    rpath: str | None = None
    runpath: str | None = None
    nodeflib: bool = False

    def as_fact(self) -> dict:
        """JSON for a capture (a capture keeps only a library's first MiB)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_fact(cls, fact: dict) -> Dynamic:
        return cls(tuple(fact.get("needed", ())), fact.get("soname"), fact.get("rpath"),
                   fact.get("runpath"), bool(fact.get("nodeflib")))


def read_dynamic(root: SysRoot, path: str) -> Dynamic:
    """The dynamic section of the ELF object at ``path``; :class:`ElfUnreadable` if it has
    none or cannot be read (absent, truncated, not 64-bit little-endian)."""
    try:
        with root.open(root.realpath(path)) as handle:    # a link's target is a path on the machine
            return _read(handle)
    except OSError as error:
        raise ElfUnreadable(f"cannot be opened ({error.strerror or error})") from None


def _read(handle) -> Dynamic:
    header = handle.read(EHDR.size)
    if header[:4] != ELF_MAGIC:
        raise ElfUnreadable("is not an ELF object")
    if len(header) < EHDR.size:
        raise ElfUnreadable(f"is cut short at {len(header)} bytes")
    ident, _type, _machine, _version, _entry, phoff, _shoff, _flags, _ehsize, phentsize, phnum, *_ = \
        EHDR.unpack(header)
    if (ident[4], ident[5]) != (ELFCLASS64, ELFDATA2LSB):
        raise ElfUnreadable(f"is not a 64-bit little-endian ELF object (class {ident[4]}, data {ident[5]}): "
                            "only those are read")
    if phentsize != PHDR.size or phnum == PN_XNUM or phnum > MAX_PHDRS:
        raise ElfUnreadable(f"has {phnum} program headers of {phentsize} bytes: more than this reader reads")
    table = _read_at(handle, phoff, phnum * PHDR.size)
    headers = [PHDR.unpack_from(table, index * PHDR.size) for index in range(phnum)]
    dynamic = [(offset, size) for kind, _, offset, _, _, size, _, _ in headers if kind == PT_DYNAMIC]
    if not dynamic:
        raise ElfUnreadable("has no dynamic section (a static program)")
    offset, size = dynamic[0]
    if size > MAX_DYNAMIC_BYTES:
        raise ElfUnreadable(f"has a dynamic section of {size} bytes: more than this reader reads")
    entries = _entries(_read_at(handle, offset, size))
    strtab = _file_offset(headers, entries.get(DT_STRTAB, [None])[0])
    strsz = entries.get(DT_STRSZ, [0])[0]

    def string(at: int) -> str:
        if at >= strsz:
            raise ElfUnreadable(f"names a string at {at}, past its string table ({strsz} bytes)")
        data = _read_at(handle, strtab + at, min(MAX_STRING_BYTES, strsz - at))
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")

    named = [string(at) for at in entries.get(DT_NEEDED, [])[:MAX_STRINGS]]
    first = {tag: string(entries[tag][0]) if tag in entries else None for tag in (DT_SONAME, DT_RPATH, DT_RUNPATH)}
    return Dynamic(tuple(named), first[DT_SONAME], first[DT_RPATH], first[DT_RUNPATH],
                   bool(entries.get(DT_FLAGS_1, [0])[0] & DF_1_NODEFLIB))


def _entries(data: bytes) -> dict[int, list[int]]:
    """Each tag's values in order, up to DT_NULL."""
    found: dict[int, list[int]] = {}
    for index in range(len(data) // DYN.size):
        tag, value = DYN.unpack_from(data, index * DYN.size)
        if tag == DT_NULL:
            break
        found.setdefault(tag, []).append(value)
    return found


def _file_offset(headers: list[tuple], address: int | None) -> int:
    """Where the string table's address lies in the file: the PT_LOAD segment that maps it."""
    if address is None:
        raise ElfUnreadable("has no string table (DT_STRTAB)")
    for kind, _, offset, vaddr, _, filesz, _, _ in headers:
        if kind == PT_LOAD and vaddr <= address < vaddr + filesz:
            return offset + address - vaddr
    raise ElfUnreadable(f"maps its string table (0x{address:x}) in no loadable segment")


def _read_at(handle, offset: int, size: int) -> bytes:
    if offset + size > MAX_FILE_OFFSET:
        raise ElfUnreadable(f"names {size} bytes at offset {offset}, past the end of any file")
    handle.seek(offset)
    data = handle.read(size)
    if len(data) < size:
        raise ElfUnreadable(f"is cut short at {offset + len(data)} bytes (a capture keeps only the first MiB)")
    return data
