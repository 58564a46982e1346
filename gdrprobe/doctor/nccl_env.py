"""NCCL environment variables that disable or restrict GPUDirect RDMA, and what NCCL does with each.

The behaviour described follows NCCL 2.30's source (see shared/reference/nccl_gdr.md):
for example NCCL_NET_GDR_LEVEL is matched case-sensitively and an unknown spelling is
silently ignored, which is why it is parsed here exactly as NCCL parses it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping

from gdrprobe.doctor.context import DoctorContext
from gdrprobe.nccl.env import NCCL_CLASS_OF_DISTANCE, GdrLevel, gdr_level, int_value
from gdrprobe.report.model import Evidence, Finding, Status

finding = functools.partial(Finding, group="nccl")

def is_nonzero(text: str) -> bool:
    return int_value(text) not in (None, 0)


def is_zero(text: str) -> bool:
    return int_value(text) == 0


def always(_text: str) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Rule:
    """A variable whose value, when ``applies``, changes what NCCL does with GPUDirect."""

    variable: str
    applies: Callable[[str], bool]
    status: Status
    effect: str
    fix: str = ""


UNSET_FIX = "Unset it unless you are deliberately A/B testing."
SIMPLE_RULES = (
    Rule("NCCL_IB_DISABLE", is_nonzero, Status.FAIL,
         "NCCL will not use InfiniBand/RoCE verbs and falls back to TCP sockets through host memory: no GPUDirect RDMA",
         UNSET_FIX),
    Rule("NCCL_NET", lambda value: value.strip().lower() == "socket", Status.FAIL,
         "NCCL uses the socket transport: traffic goes through host memory, no GPUDirect RDMA", UNSET_FIX),
    Rule("NCCL_NET_GDR_READ", is_zero, Status.WARN,
         "NCCL will not let the NIC read GPU memory on the send side: sends stage through host memory, "
         "receives can still use GPUDirect RDMA", UNSET_FIX),
    Rule("NCCL_DMABUF_ENABLE", is_zero, Status.WARN,
         "NCCL will not use DMA-BUF: GPU memory is registered only through nvidia-peermem, "
         "and without it GPUDirect RDMA is off", UNSET_FIX),
    Rule("NCCL_NET_GDR_C2C", is_zero, Status.WARN,
         "the default GDR level becomes PXB instead of P2C: on C2C platforms (Grace) NICs attached to the CPU "
         "lose GPUDirect RDMA", UNSET_FIX),
    Rule("NCCL_GDR_FLUSH_DISABLE", is_nonzero, Status.WARN,
         "NCCL skips the flush that makes NIC writes visible to the GPU before sm90: received data may be stale",
         UNSET_FIX),
    Rule("NCCL_TOPO_FILE", always, Status.WARN,
         "NCCL reads the topology from this file instead of detecting it; a gdr= attribute in the file wins "
         "over the detected value even though the log shows the detected one",
         "Make sure the file describes this machine, or unset it to let NCCL detect the topology."),
    Rule("NCCL_PXN_DISABLE", is_nonzero, Status.INFO,
         "NCCL will not relay through an NVLink peer GPU to that GPU's nearer NIC, so some GPUs use a farther NIC"),
    Rule("NCCL_IB_PCI_RELAXED_ORDERING", is_zero, Status.INFO,
         "NCCL registers memory without PCIe relaxed ordering, which costs bandwidth in virtual machines"),
    Rule("NCCL_IB_CUDA_SUPPORT", always, Status.WARN,
         "removed in NCCL 2.4.0: no code reads it, so it has no effect",
         "Use NCCL_NET_GDR_LEVEL instead, or unset it."),
    Rule("NCCL_IB_GDR_LEVEL", always, Status.WARN,
         "renamed in NCCL 2.4.0: no code reads it, so it has no effect",
         "Use NCCL_NET_GDR_LEVEL instead, or unset it."),
    Rule("NCCL_GDRCOPY_ENABLE", always, Status.INFO,
         "GDRCopy is a CPU-side copy mechanism; it neither enables nor disables GPUDirect RDMA to the NIC"),
)


def rule_finding(rule: Rule, value: str) -> Finding:
    return finding(
        id="nccl." + rule.variable[len("NCCL_"):].lower(),
        status=rule.status,
        summary=f"{rule.variable}={value}: {rule.effect}",
        evidence=(Evidence(f"environment {rule.variable}", value),),
        fix=rule.fix,
    )


def simple_rule_findings(environ: Mapping[str, str]) -> list[Finding]:
    return [rule_finding(rule, environ[rule.variable]) for rule in SIMPLE_RULES
            if rule.variable in environ and rule.applies(environ[rule.variable])]


# ---- NCCL_NET_GDR_LEVEL -----------------------------------------------------


def pairs_beyond_level(ctx: DoctorContext, level: GdrLevel) -> list[Evidence]:
    """Each GPU whose nearest NIC is farther than ``level``, so GDR is off for it."""
    beyond = []
    for gpu in ctx.topology.gpus:
        nic, distance = ctx.topology.nearest_nic(gpu)
        if nic is not None and not level.admits(NCCL_CLASS_OF_DISTANCE[distance]):
            beyond.append(Evidence(f"GPU {gpu.bdf} -> nearest NIC {nic.name}", distance))
    return beyond


def gdr_level_findings(ctx: DoctorContext) -> list[Finding]:
    value = ctx.environ.get("NCCL_NET_GDR_LEVEL")
    if value is None:
        return []
    evidence = (Evidence("environment NCCL_NET_GDR_LEVEL", value),)
    level = gdr_level(ctx.environ)
    if level.ignored:
        return [finding(id="nccl.net_gdr_level", status=Status.WARN,
                        summary=f"NCCL_NET_GDR_LEVEL={value} is not a spelling NCCL accepts (names are "
                                "case-sensitive, NODE does not exist): NCCL silently ignores it and uses its default",
                        evidence=evidence,
                        fix="Use one of PIX, PXB, P2C, PHB, SYS (upper case), or unset it.")]
    if not level.admits("PIX"):
        return [finding(id="nccl.net_gdr_level", status=Status.FAIL,
                        summary=f"NCCL_NET_GDR_LEVEL={value} means {level.name}: no NIC is that close to a GPU, "
                                "so NCCL disables GPUDirect RDMA everywhere",
                        evidence=evidence, fix=UNSET_FIX)]
    beyond = pairs_beyond_level(ctx, level)
    if beyond:
        return [finding(id="nccl.net_gdr_level", status=Status.WARN,
                        summary=f"NCCL_NET_GDR_LEVEL={value} means {level.name}: GPUDirect RDMA is off for "
                                f"{len(beyond)} GPU(s) whose nearest NIC is farther",
                        evidence=evidence + tuple(beyond),
                        fix="Unset it (the default admits PIX, PXB and P2C) or move the NIC closer to the GPU.")]
    return [finding(id="nccl.net_gdr_level", status=Status.INFO,
                    summary=f"NCCL_NET_GDR_LEVEL={value} means {level.name}; it replaces NCCL's default (P2C from 2.29, PXB before) and "
                            "admits every GPU's nearest NIC",
                    evidence=evidence)]


# ---- NCCL_IB_HCA ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HcaFilter:
    """NCCL_IB_HCA parsed as NCCL parses it: "^" excludes, "=" asks for exact names."""

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


def ib_hca_findings(ctx: DoctorContext) -> list[Finding]:
    value = ctx.environ.get("NCCL_IB_HCA")
    if value is None:
        return []
    hca_filter = parse_hca_filter(value)
    excluded = []
    for gpu in ctx.topology.gpus:
        nic, distance = ctx.topology.nearest_nic(gpu)
        if nic is not None and not hca_filter.selects(nic.name):
            excluded.append(Evidence(f"GPU {gpu.bdf} -> nearest NIC {nic.name}", distance))
    evidence = (Evidence("environment NCCL_IB_HCA", value),)
    if excluded:
        return [finding(id="nccl.ib_hca", status=Status.WARN,
                        summary=f"NCCL_IB_HCA={value} excludes the nearest NIC of {len(excluded)} GPU(s): "
                                "NCCL will use a farther NIC, where GPUDirect RDMA may be off or slower",
                        evidence=evidence + tuple(excluded),
                        fix="Include every GPU's nearest NIC in NCCL_IB_HCA (mind that names without '=' "
                            "match as prefixes), or unset it.")]
    return [finding(id="nccl.ib_hca", status=Status.INFO,
                    summary=f"NCCL_IB_HCA={value} keeps every GPU's nearest NIC", evidence=evidence)]


# ---- the check --------------------------------------------------------------


def check(ctx: DoctorContext) -> list[Finding]:
    nccl_variables = {name: value for name, value in ctx.environ.items() if name.startswith("NCCL_")}
    findings = simple_rule_findings(ctx.environ) + gdr_level_findings(ctx) + ib_hca_findings(ctx)
    if findings:
        return findings
    return [finding(
        id="nccl.env",
        status=Status.OK,
        summary="no NCCL variable restricts GPUDirect RDMA" if nccl_variables
        else "no NCCL variables are set; NCCL uses its defaults",
        evidence=tuple(Evidence(f"environment {name}", value) for name, value in sorted(nccl_variables.items())),
    )]
