"""What NCCL's own decision means for the gate: for each GPU, will NCCL use GPUDirect RDMA
at all, and where it will not, is the cause an NCCL setting or this node?

The doctor decides, by NCCL's rules, the NIC, the path and GDR for receives and sends of
every GPU (:mod:`gdrprobe.nccl.decision`). Two variables act before any of that: with
``NCCL_IB_DISABLE`` set non-zero NCCL's IB transport does not start
(``src/transport/net_ib/init.cc`` ncclIbInitDevices returns an error) and with
``NCCL_NET=Socket`` NCCL picks the socket transport by name (``src/plugin/net.cc``, a
case-insensitive strcasecmp against each transport's name): either way every byte goes
through host memory.

Who is to blame is a what-if on the same facts: the decision again with no ``NCCL_*``
variable at all (NCCL's defaults). GPUDirect on there but off here: the settings are the
cause, each one found by dropping it alone (a job image's ``NCCL_NET_GDR_LEVEL=LOC``, an
``/etc/nccl.conf`` line); the node is fine. Off with the defaults too: the node's topology
or stack makes NCCL refuse it (a NIC beyond NCCL's GDR level, no peer memory and no
DMA-BUF NCCL can use, a GPU without GPUDirect support).
"""

from __future__ import annotations

from typing import Callable
from collections.abc import Mapping, Sequence

from gdrprobe.nccl.decision import NodeFacts, decide
from gdrprobe.nccl.env import int_param
from gdrprobe.nccl.flush import NcclFlush, unknown_decision
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report import finding_ids
from gdrprobe.report.check import NcclUse
from gdrprobe.report.model import NcclGpuDecision

Decide = Callable[[Mapping[str, str]], Sequence[NcclGpuDecision]]
SOCKET_TRANSPORT = "socket"


def deciding(facts: NodeFacts, rules: NcclRules | None = None) -> Decide:
    """NCCL's decision on these facts under any environment, by the rules of the NCCL the
    job loads (None: 2.30.7's)."""
    def under(environ: Mapping[str, str]) -> Sequence[NcclGpuDecision]:
        return decide(facts, environ, rules)
    return under


def transport_refusal(environ: Mapping[str, str]) -> str | None:
    """Why NCCL uses no RDMA transport at all under this environment, or None."""
    if int_param(environ, "NCCL_IB_DISABLE", 0) != 0:
        return ("NCCL_IB_DISABLE turns NCCL's InfiniBand/RoCE transport off "
                "(net_ib/init.cc ncclIbInitDevices): NCCL sends through sockets in host "
                "memory")
    if environ.get("NCCL_NET", "").lower() == SOCKET_TRANSPORT:
        return ("NCCL_NET selects the socket transport (plugin/net.cc): NCCL sends through "
                "host memory")
    return None


def uses_gdr(decision: NcclGpuDecision | None, environ: Mapping[str, str]) -> bool:
    return (decision is not None and transport_refusal(environ) is None
            and decision.nic is not None and (decision.gdr_read or decision.gdr_write))


def why_not(decision: NcclGpuDecision, environ: Mapping[str, str]) -> str:
    refused = transport_refusal(environ)
    if refused:
        return refused
    if decision.nic is None:
        return f"no NIC NCCL may use for this GPU ({decision.why[0]})"
    return "; ".join(direction_reasons(decision))


def direction_reasons(decision: NcclGpuDecision) -> tuple[str, ...]:
    """The decision's reasons for GDR on receives and on sends."""
    return tuple(reason for reason in decision.why if reason.startswith(("receive: ", "send: ")))


class Decisions:
    """The decision under an environment, each environment decided once."""

    def __init__(self, decide: Decide):
        self.decide = decide
        self.cache: dict[tuple, dict[str, NcclGpuDecision]] = {}

    def under(self, environ: Mapping[str, str]) -> dict[str, NcclGpuDecision]:
        key = tuple(sorted(environ.items()))
        if key not in self.cache:
            self.cache[key] = {d.gpu_bdf: d for d in self.decide(environ)}
        return self.cache[key]


def without(environ: Mapping[str, str], names) -> dict[str, str]:
    return {name: value for name, value in environ.items() if name not in names}


def culprits(bdf: str, environ: Mapping[str, str], decisions: Decisions,
             source: Callable[[str], str]) -> tuple[str, ...]:
    """The NCCL settings whose removal alone gives the GPU GPUDirect back; all of them when
    no single one does (they act together)."""
    names = sorted(name for name in environ if name.startswith("NCCL_"))
    alone = [name for name in names
             if uses_gdr(decisions.under(without(environ, {name})).get(bdf),
                         without(environ, {name}))]
    return tuple(f"{name}={environ[name]} ({source(name)})" for name in alone or names)


def setting_fix(settings: Sequence[str]) -> str:
    return ("if this job should use GPUDirect RDMA, unset " + ", ".join(settings)
            + "; otherwise nothing is wrong with the node")


def node_fix(bdf: str, findings: Sequence) -> str:
    """The doctor's fix for the GPU's NCCL decision, where it has one."""
    fixes = [f.fix for f in findings if f.id == finding_ids.nccl_gpu(bdf) and f.fix]
    return fixes[0] if fixes else "run 'gdrprobe doctor': its nccl group says what NCCL refuses"


def nccl_uses(decide: Decide, environ: Mapping[str, str], source: Callable[[str], str],
              firm: bool, findings: Sequence = (),
              flush_of: Callable[[NcclGpuDecision], NcclFlush] | None = None) -> dict[str, NcclUse]:
    """For every GPU (by PCI bus id) NCCL's decision under ``environ`` (the environment as
    NCCL sees it, configuration files included) and, where GPUDirect is off, its cause.
    firm: the facts the decision rests on were read (the CUDA driver answered); flush_of:
    NCCL's flush of a GPUDirect receive into the decision's GPU."""
    decisions = Decisions(decide)
    defaults_only = without(environ, {name for name in environ if name.startswith("NCCL_")})
    uses = {}
    transport = transport_refusal(environ) is None
    for bdf, decision in decisions.under(environ).items():
        common = dict(gpu=bdf, nic=decision.nic, path=decision.path, via_gpu=decision.via_gpu,
                      receives=transport and decision.gdr_write,
                      sends=transport and decision.gdr_read, firm=firm,
                      # On a C2C system NCCL asks for the PCIe mapping type where the NIC is
                      # on a PCIe path (nccl/decision.py gdr_mode "pci").
                      pcie_mapping=decision.gdr_mode == "pci",
                      reasons=direction_reasons(decision),
                      **flush_fields(flush_of(decision) if flush_of else None))
        if uses_gdr(decision, environ):
            uses[bdf] = NcclUse(**common)
            continue
        cause = why_not(decision, environ)
        if uses_gdr(decisions.under(defaults_only).get(bdf), defaults_only):
            settings = culprits(bdf, environ, decisions, source)
            uses[bdf] = NcclUse(**common, cause=f"{', '.join(settings)}: {cause}",
                                settings=settings, fix=setting_fix(settings))
        else:
            uses[bdf] = NcclUse(**common, cause=cause, node_fault=True,
                                fix=node_fix(bdf, findings))
    return uses


def flush_fields(flush: NcclFlush | None) -> dict:
    """NcclUse's flush and flush_rule; none where nobody asked (the flush then unknown)."""
    return {} if flush is None else {"flush": flush.flushes, "flush_rule": flush.describe()}


def receive_flush(use: NcclUse | None) -> str:
    """What asks the receiver of a GPU arm for NCCL's flush before it checks the bytes ("":
    nothing does): NCCL's rule for the GPU, or where NCCL's decision is unknown, the flush
    anyway (:func:`gdrprobe.nccl.flush.unknown_decision`)."""
    if use is None or not use.flush_rule:
        return unknown_decision().describe()
    return use.flush_rule if use.flush else ""
