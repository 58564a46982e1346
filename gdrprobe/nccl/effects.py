"""What a set NCCL variable does to GPUDirect RDMA under the job's release, where one value
decides it (the variables whose effect needs the node's topology are the per-GPU decision's:
:mod:`gdrprobe.nccl.decision`). The doctor words each :class:`Effect`
(:mod:`gdrprobe.doctor.checks.nccl_env`); the rule, the value and the release live here.

- NCCL_IB_DISABLE non-zero: no IB transport (``net_ib/init.cc`` ncclIbInitDevices).
- NCCL_NET_GDR_READ: 0 turns sends off GPUDirect; > 0 turns them on also where the default
  would not (``paths.cc`` ncclTopoCheckGdr: every GPU without an NVLink peer before 2.19.1,
  only those before sm80 from 2.19.1).
- NCCL_NET_GDR_C2C=0: read from 2.26.2 (nothing before), where 0 is its default until 2.27.3;
  from 2.27.3 it turns GDR off for a C2C GPU's NICs behind its CPU, and from 2.29.2 also
  NCCL_NET_GDR_LEVEL's default P2C back to PXB. Nothing changes on a node without a C2C GPU.
- NCCL_GDR_FLUSH_DISABLE non-zero: no flush QP (``net_ib/connect.cc`` flushEnabled).
- NCCL_PXN_DISABLE exactly 1 (2.12.7 on), NCCL_IB_PCI_RELAXED_ORDERING other than 1 and 2
  (2.12.7 on), NCCL_NETDEVS_POLICY (2.28.3 on): before those releases, not read.
- NCCL_IB_CUDA_SUPPORT and NCCL_IB_GDR_LEVEL: read by no release since 2.4.0.
- NCCL_TOPO_FILE, NCCL_GDRCOPY_ENABLE: said whatever their value (what the file does is the
  topology check's; GDRCopy is a CPU copy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.env import pxn_disabled, relaxed_ordering_wanted
from gdrprobe.nccl.versions import GDR_READ_PRE_AMPERE_SINCE, NcclRules, dotted

# The effects, by what the doctor says of them.
IB_OFF = "ib-off"
SEND_GDR_OFF = "send-gdr-off"
SEND_GDR_FORCED = "send-gdr-forced"
C2C_GDR_OFF = "c2c-gdr-off"
FLUSH_OFF = "flush-off"
TOPO_FILE = "topo-file"
PXN_OFF = "pxn-off"
RELAXED_ORDERING_OFF = "relaxed-ordering-off"
REMOVED = "removed"
GDRCOPY = "gdrcopy"
NOT_READ = "not-read"          # set, but this release does not read it: no effect
THE_DEFAULT = "the-default"    # set to what this release does anyway: no effect
NOT_HERE = "not-here"          # changes a rule no GPU of this node meets: no effect here

# The variables this module judges, in the order the doctor lists them.
JUDGED = (params.IB_DISABLE, params.NET_GDR_READ, params.NET_GDR_C2C, params.GDR_FLUSH_DISABLE,
          params.TOPO_FILE, params.PXN_DISABLE, params.IB_PCI_RELAXED_ORDERING, params.NETDEVS_POLICY,
          params.IB_CUDA_SUPPORT, params.IB_GDR_LEVEL, params.GDRCOPY_ENABLE)


@dataclasses.dataclass(frozen=True)
class Effect:
    """One set variable's effect: ``kind`` is one of this module's names; ``detail`` the
    release words that go with it (the release, what it does instead)."""

    param: params.Param
    value: str
    kind: str
    detail: str = ""


def effects(environ: Mapping[str, str], rules: NcclRules | None = None,
            c2c_gpus: bool | None = None) -> list[Effect]:
    """The effect of each judged variable that is set, under this release (None: 2.30.7's);
    c2c_gpus: whether a GPU of the node reaches its CPU over C2C (None: not known)."""
    rules = rules or NcclRules()
    found = []
    for param in JUDGED:
        value = param.raw(environ)
        if value is None:
            continue
        effect = not_read(param, value, rules) or judge(param, value, environ, rules, c2c_gpus)
        if effect is not None:
            found.append(effect)
    return found


def not_read(param: params.Param, value: str, rules: NcclRules) -> Effect | None:
    if param.until is not None and rules.effective > param.until:
        return Effect(param, value, REMOVED, f"read by no release since {dotted(next_release(param.until))}")
    if not param.read_by(rules.effective, rules.library):
        return Effect(param, value, NOT_READ, f"{rules.described} does not read it "
                                              f"(NCCL reads it from {dotted(param.since)})")
    return None


def next_release(last: params.Version) -> params.Version:
    """The release after the last that read a variable (2.3.7 -> 2.4.0)."""
    return (last[0], last[1] + 1, 0)


def judge(param: params.Param, value: str, environ: Mapping[str, str], rules: NcclRules,
          c2c_gpus: bool | None) -> Effect | None:
    number = param.number({param.name: value}, rules) if param.kind == params.INT else None
    if param is params.IB_DISABLE:
        return Effect(param, value, IB_OFF) if number else None
    if param is params.NET_GDR_READ:
        return gdr_read_effect(value, number, rules)
    if param is params.NET_GDR_C2C:
        return c2c_effect(value, number, rules, c2c_gpus)
    if param is params.GDR_FLUSH_DISABLE:
        return Effect(param, value, FLUSH_OFF) if number else None
    if param is params.PXN_DISABLE:
        return Effect(param, value, PXN_OFF) if pxn_disabled({param.name: value}) else None
    if param is params.IB_PCI_RELAXED_ORDERING:
        wanted = relaxed_ordering_wanted({param.name: value})
        return None if wanted else Effect(param, value, RELAXED_ORDERING_OFF)
    if param is params.TOPO_FILE:
        return Effect(param, value, TOPO_FILE)
    if param is params.GDRCOPY_ENABLE:
        return Effect(param, value, GDRCOPY)
    return None      # NCCL_NETDEVS_POLICY: its spelling is judged on its own (env.netdevs_policy)


def gdr_read_effect(value: str, number: int | None, rules: NcclRules) -> Effect | None:
    if number == 0:
        return Effect(params.NET_GDR_READ, value, SEND_GDR_OFF)
    if number is None or number <= 0:
        return None
    where = ("GPUs before Ampere without an NVLink peer" if rules.since(GDR_READ_PRE_AMPERE_SINCE)
             else "every GPU without an NVLink peer")
    return Effect(params.NET_GDR_READ, value, SEND_GDR_FORCED, where)


def c2c_effect(value: str, number: int | None, rules: NcclRules, c2c_gpus: bool | None) -> Effect | None:
    if number:
        return None
    default = params.NET_GDR_C2C.default(rules.effective)
    if default == 0:
        return Effect(params.NET_GDR_C2C, value, THE_DEFAULT,
                      f"0 is {rules.described}'s default (1 from {dotted(params.NET_GDR_C2C.first_with(1))})")
    if c2c_gpus is False:
        return Effect(params.NET_GDR_C2C, value, NOT_HERE, "no GPU of this node reaches its CPU over C2C")
    level = rules.default_gdr_level({}) != rules.default_gdr_level({params.NET_GDR_C2C.name: value})
    return Effect(params.NET_GDR_C2C, value, C2C_GDR_OFF,
                  "NCCL_NET_GDR_LEVEL's default falls from P2C to PXB" if level else "")
