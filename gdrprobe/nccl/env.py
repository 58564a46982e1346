"""NCCL's environment variables read as NCCL reads them, and its GDR level: one table, one
parser, used by every doctor check that needs them.

The rules follow NCCL 2.30's source (NVIDIA/nccl): the path types and their order are
``src/include/graph.h``; NCCL_NET_GDR_LEVEL is parsed in ``src/graph/paths.cc``
(ncclTopoCheckGdr): an exact, case-sensitive path name, else an integer (0..3 the old
levels, anything larger SYS), else NCCL keeps its default and says nothing.
"""

from __future__ import annotations

import dataclasses
import re
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


def int_value(text: str) -> int | None:
    """The integer NCCL would read (it uses strtoll), or None."""
    match = re.match(r"\s*([-+]?\d+)", text)
    return int(match.group(1)) if match else None


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
    c2c = int_value(environ.get("NCCL_NET_GDR_C2C", "1"))
    return "PXB" if c2c == 0 else "P2C"


def gdr_level(environ: Mapping[str, str]) -> GdrLevel:
    """NCCL_NET_GDR_LEVEL as NCCL parses it: exact names, integers, else ignored."""
    raw = environ.get("NCCL_NET_GDR_LEVEL")
    if raw is None:
        return GdrLevel(default_gdr_level(environ), None, ignored=False)
    if raw in PATH_RANK:
        return GdrLevel(raw, raw, ignored=False)
    number = int_value(raw) if raw[:1].isdigit() else None
    if number is not None:
        return GdrLevel(LEGACY_LEVELS[min(number, len(LEGACY_LEVELS) - 1)], raw, ignored=False)
    return GdrLevel(default_gdr_level(environ), raw, ignored=True)
