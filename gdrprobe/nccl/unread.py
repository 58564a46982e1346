"""Where NCCL would read facts the doctor could not: NVLink and C2C (NVML). NCCL reads them
for every GPU (src/graph/xml.cc ncclTopoGetXmlFromGpu) and they only ever give GPUDirect
RDMA back: an NVLink peer with GDR to a NIC is a PXN relay (src/graph/paths.cc
ncclTopoComputePaths), a C2C link makes a GPU's path to its CPU's NICs P2C, within NCCL's
default GDR level (mergePathType), and an NVLink peer lifts NCCL_NET_GDR_READ's pre-Ampere
rule (ncclTopoCheckGdr). So the decision is taken again with them as favourable as the
machine allows (:func:`favourable`), and a GPU whose GPUDirect that turns on is marked
undecided (``NcclGpuDecision.unread``): a warning, never a node fault.

As favourable as NCCL's own reading allows: every GPU whose links were not read joins one
NVSwitch with NCCL's 18 links (so any two of them are NVLink peers), and gets a C2C link
where NCCL would ask for one: its compute capability is unknown or sm90 on. The CPU is not
consulted (a C2C link joins a GPU to a Grace-family CPU, but NCCL does not look, and a node
must not be drained on a guess): an x86 node without NVML whose NIC is beyond the GDR level
is undecided too, where NVML would have said it is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gdrprobe.nccl.topo import NOT_VISIBLE

NVLINKS_AT_MOST = 18          # xml.cc: the links NCCL asks about from sm90
C2C_FROM_SM = 90              # xml.cc: C2C links are asked for from sm90


def c2c_possible(capability: int | None) -> bool:
    return capability is None or capability >= C2C_FROM_SM


def favourable(facts):
    """The node's facts with every unread GPU's NVLink and C2C as favourable as they can be
    (a ``NodeFacts``; its GpuFacts replaced)."""
    gpus = {}
    for bdf, gpu in facts.gpu_facts.items():
        if not gpu.links_unread:
            gpus[bdf] = gpu
            continue
        c2c = 1 if c2c_possible(gpu.capability) else gpu.c2c_links
        gpus[bdf] = dataclasses.replace(gpu, c2c_links=c2c, nvlinks=(NOT_VISIBLE,) * NVLINKS_AT_MOST)
    return dataclasses.replace(facts, gpu_facts=gpus)


def undecided(actual, possible, reason: str) -> str:
    """Why the GPU's decision is not taken ("": it is): GPUDirect off one way, on with the
    unread facts."""
    directions = [name for name, off, on in (("receives", actual.gdr_write, possible.gdr_write),
                                             ("sends", actual.gdr_read, possible.gdr_read)) if on and not off]
    if not directions:
        return ""
    return (f"not decided: NVLink and C2C could not be read ({reason}), and with an NVLink peer (PXN) or a C2C "
            f"link (P2C) NCCL would use GPUDirect RDMA for this GPU's {' and '.join(directions)} "
            "(src/graph/paths.cc ncclTopoComputePaths, ncclTopoCheckGdr)")


def marked(decisions: tuple, facts, under: Callable) -> tuple:
    """The decisions (NcclGpuDecision), each GPUDirect that unread facts could give back
    marked (``unread``); ``under``: the decision on other facts, same environment."""
    reasons = [gpu.links_unread for gpu in facts.gpu_facts.values() if gpu.links_unread]
    if not reasons:
        return decisions
    possible = {decision.gpu_bdf: decision for decision in under(favourable(facts))}
    return tuple(dataclasses.replace(d, unread=undecided(d, possible[d.gpu_bdf], reasons[0]))
                 if d.gpu_bdf in possible else d for d in decisions)
