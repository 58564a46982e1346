"""NCCL's environment variables read as NCCL reads them, and its GDR level: one table, one
parser, used by every doctor check that needs them.

The rules follow NCCL 2.30.7's source (NVIDIA/nccl): the path types and their order are
``src/include/graph.h``; integer variables are read by ``ncclLoadParam``
(``src/misc/param.cc``) with ``strtoll(str, NULL, 0)``, so ``0x10`` is hex, ``010`` is
octal (8), ``08`` is 0 and ``yes`` is 0; NCCL_NET_GDR_LEVEL is parsed by ``ncclGetLevel``
(``src/graph/paths.cc``): an exact, case-sensitive path name, else, when the first
character is a digit, ``strtol(str, NULL, 0)`` into the old levels (0..3, anything larger
SYS), else NCCL keeps its default and says nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

# NCCL's path types, nearest first, with the rank its gates compare (src/include/graph.h).
PATH_RANK = {"LOC": 0, "NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6,
             "PXN": 7, "PHB": 8, "SYS": 9}
# Integers NCCL_NET_GDR_LEVEL accepted before the names existed; 4 and above mean SYS.
LEGACY_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
# nvidia-smi's distances as NCCL classes them: NCCL has no NODE (two host bridges of one
# NUMA node hang off one CPU node in its graph), so NODE is PHB to NCCL.
NCCL_CLASS_OF_DISTANCE = {"X": "LOC", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB",
                          "NODE": "PHB", "SYS": "SYS"}


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
INT64_MAX = (1 << 63) - 1


def strtoll(text: str) -> int | None:
    """C's ``strtoll(text, NULL, 0)``: leading blanks and sign, ``0x`` hex, a leading ``0``
    octal, else decimal, up to the first character that is no digit of the base; 0 when
    there is no digit at all; None where C sets ERANGE (NCCL then keeps the default)."""
    rest = text.lstrip(" \t\n\r\f\v")
    sign = -1 if rest[:1] == "-" else 1
    rest = rest[1:] if rest[:1] in "+-" else rest
    base = 10
    if rest[:2].lower() == "0x" and rest[2:3].lower() in _DIGITS[:16] and rest[2:3]:
        base, rest = 16, rest[2:]
    elif rest[:1] == "0":
        base = 8
    digits = ""
    for char in rest.lower():
        if char not in _DIGITS[:base]:
            break
        digits += char
    value = sign * int(digits, base) if digits else 0
    return value if -INT64_MAX - 1 <= value <= INT64_MAX else None


def int_value(text: str) -> int | None:
    """The integer ``ncclLoadParam`` reads from a set variable: None for an empty value or an
    overflow, where NCCL keeps its default."""
    return strtoll(text) if text else None


def int_param(environ: Mapping[str, str], name: str, default: int) -> int:
    """An NCCL integer variable as NCCL sees it (``NCCL_PARAM`` / ``ncclLoadParam``)."""
    value = int_value(environ.get(name, ""))
    return default if value is None else value


def relaxed_ordering_wanted(environ: Mapping[str, str]) -> bool:
    """NCCL_IB_PCI_RELAXED_ORDERING (default 2): 1 and 2 ask for relaxed ordering where the
    verbs library offers it (IBVERBS_1.8), 0 turns it off (NCCL 2.x net_ib
    ncclIbRelaxedOrderingCapable)."""
    return int_param(environ, "NCCL_IB_PCI_RELAXED_ORDERING", 2) in (1, 2)


@dataclasses.dataclass(frozen=True)
class GdrLevel:
    """The threshold NCCL_NET_GDR_LEVEL sets: GDR is used up to and including ``name``."""

    name: str
    raw: str | None                # the variable's value; None when unset
    ignored: bool                  # set to something NCCL does not parse, so the default holds

    def admits(self, nccl_class: str) -> bool:
        return PATH_RANK[nccl_class] <= PATH_RANK[self.name]


def default_gdr_level(environ: Mapping[str, str]) -> str:
    """NCCL's own threshold: P2C while NCCL_NET_GDR_C2C is on (its default), else PXB."""
    return "P2C" if int_param(environ, "NCCL_NET_GDR_C2C", 1) else "PXB"


def gdr_level(environ: Mapping[str, str]) -> GdrLevel:
    """NCCL_NET_GDR_LEVEL as NCCL parses it: exact names, integers, else ignored."""
    raw = environ.get("NCCL_NET_GDR_LEVEL")
    if raw is None:
        return GdrLevel(default_gdr_level(environ), None, ignored=False)
    if raw in PATH_RANK:
        return GdrLevel(raw, raw, ignored=False)
    # ncclGetLevel: strtol(str, NULL, 0) only when the first character is a digit.
    if raw[:1] in "0123456789":
        number = strtoll(raw)
        # strtol saturates on overflow; levelsOldToNew clamps anything past its end to SYS.
        top = len(LEGACY_LEVELS) - 1
        return GdrLevel(LEGACY_LEVELS[top if number is None else min(number, top)], raw, ignored=False)
    return GdrLevel(default_gdr_level(environ), raw, ignored=True)


@dataclasses.dataclass(frozen=True)
class HcaFilter:
    """NCCL_IB_HCA parsed as NCCL parses it (src/transport/net_ib/init.cc ncclIbInitDevices,
    parseStringList/matchIfList): "^" excludes, "=" asks for exact names, else prefixes."""

    exclude: bool
    exact: bool
    names: tuple[str, ...]        # device names, ":port" stripped

    def selects(self, device: str) -> bool:
        matched = any(device == name if self.exact else device.startswith(name) for name in self.names)
        return matched != self.exclude


def parse_hca_filter(value: str) -> HcaFilter:
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    names = tuple(entry.split(":")[0].strip() for entry in rest.split(",") if entry.strip())
    return HcaFilter(exclude, exact, names)
