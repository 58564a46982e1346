"""What NCCL's own decision means for the gate: for each GPU, will NCCL use GPUDirect RDMA
at all, through which registration, and where it will not, is the cause an NCCL setting or
this node?

The doctor decides, by NCCL's rules, the NIC, the path, GDR for receives and sends and the
registration (DMA-BUF or peer memory) of every GPU (:mod:`gdrprobe.nccl.decision`). Some
settings decide alone, whatever the topology (:func:`gdrprobe.nccl.refusals.environment_refusal`:
``NCCL_IB_DISABLE``, ``NCCL_NET=Socket``, a GDR level no path reaches): their answer holds
for every GPU the job has, also where the topology could not be read.

Who is to blame is a what-if on the same facts: the decision again with no ``NCCL_*``
variable at all (NCCL's defaults). GPUDirect on there but off here: the settings are the
cause, each one found by dropping it alone (a job image's ``NCCL_NET_GDR_LEVEL=LOC``, an
``/etc/nccl.conf`` line); the node is fine. Off with the defaults too: the node's topology
or stack makes NCCL refuse it (a NIC beyond NCCL's GDR level, no peer memory and no
DMA-BUF NCCL can use, a GPU without GPUDirect support), unless a setting NCCL leaves off by
design gives it back (an MLO partition without NCCL_NET_GDR_MLOPART): NCCL's policy, not the
node's fault; or NVLink and C2C facts NCCL reads and the doctor could not would give it back
(:mod:`gdrprobe.nccl.unread`): not decided, evidence only, never a node fault.

``--mem gpu`` (the mechanism left to gdrprobe) follows NCCL: the GPU arm registers its
memory as NCCL will (:func:`as_nccl_registers`); ``--mem dmabuf`` and ``--mem peermem`` stay
as asked.
"""

from __future__ import annotations

import dataclasses
from typing import Callable
from collections.abc import Collection, Mapping, Sequence

from gdrprobe.memory.spec import GPUDIRECT_PROOF_MEMORY, MemorySpec
from gdrprobe.nccl import data_direct, params
from gdrprobe.nccl.decision import OPT_IN_SETTINGS, SOCKET_PATH, NodeFacts, decide
from gdrprobe.nccl.refusals import environment_refusal, transport_refusal
from gdrprobe.nccl.flush import NcclFlush, unknown_decision
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report import finding_ids
from gdrprobe.report.check import NcclUse
from gdrprobe.report.model import NcclGpuDecision

# A decision resting on NVLink and C2C facts the doctor could not read (nccl/unread.py).
UNREAD_FIX = ("let the doctor read the NVIDIA driver's libnvidia-ml.so.1 as NCCL does (see the doctor's "
              "gpu.nvml); until then the A/B's answer stands alone")
Decide = Callable[[Mapping[str, str]], Sequence[NcclGpuDecision]]
WouldUse = Callable[[Mapping[str, str]], bool]


def deciding(facts: NodeFacts, rules: NcclRules | None = None,
             job_gpus: Collection[str] | None = None) -> Decide:
    """NCCL's decision on these facts under any environment, by the rules of the NCCL the
    job loads (None: 2.30.7's), for the job's GPUs (None: the node's)."""
    def under(environ: Mapping[str, str]) -> Sequence[NcclGpuDecision]:
        return decide(facts, environ, rules, job_gpus)
    return under


def uses_gdr(decision: NcclGpuDecision | None) -> bool:
    return decision is not None and decision.nic is not None and (decision.gdr_read or decision.gdr_write)


def why_not(decision: NcclGpuDecision) -> str:
    if decision.path == SOCKET_PATH:
        return decision.why[0]
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


def nccl_names(environ: Mapping[str, str]) -> list[str]:
    return params.library_variables(environ)


def culprits(environ: Mapping[str, str], would_use: WouldUse, source: Callable[[str], str]) -> tuple[str, ...]:
    """The NCCL settings whose removal alone gives the GPU GPUDirect back; all of them when
    no single one does (they act together)."""
    names = nccl_names(environ)
    alone = [name for name in names if would_use(without(environ, {name}))]
    return tuple(f"{name}={environ[name]} ({source(name)})" for name in alone or names)


def setting_fix(settings: Sequence[str]) -> str:
    return ("if this job should use GPUDirect RDMA, unset " + ", ".join(settings)
            + "; otherwise nothing is wrong with the node")


def node_fix(bdf: str, findings: Sequence) -> str:
    """The doctor's fix for the GPU's NCCL decision, where it has one."""
    fixes = [f.fix for f in findings if f.id == finding_ids.nccl_gpu(bdf) and f.fix]
    return fixes[0] if fixes else "run 'gdrprobe doctor': its nccl group says what NCCL refuses"


@dataclasses.dataclass(frozen=True)
class UseContext:
    """What every GPU's use is judged with."""

    source: Callable[[str], str]       # where a variable comes from
    firm: bool                         # the facts the decision rests on were read
    findings: Sequence = ()
    rules: NcclRules | None = None
    refusal: str | None = None         # why the environment alone keeps NCCL off GPUDirect
    flush_of: Callable[[NcclGpuDecision], NcclFlush] | None = None   # NCCL's flush of a receive


def setting_caused(common: dict, cause: str, settings: tuple[str, ...]) -> NcclUse:
    return NcclUse(**common, cause=f"{', '.join(settings)}: {cause}", settings=settings,
                   fix=setting_fix(settings))


def decided_use(decision: NcclGpuDecision, environ: Mapping[str, str], decisions: Decisions,
                context: UseContext) -> NcclUse:
    """One GPU's use from its decision. A setting that decides alone makes it firm whatever
    facts are missing; the node is blamed only on facts that were read."""
    bdf = decision.gpu_bdf
    common = dict(gpu=bdf, nic=decision.nic, path=decision.path, via_gpu=decision.via_gpu,
                  receives=decision.gdr_write, sends=decision.gdr_read,
                  firm=context.firm and not decision.unread or context.refusal is not None,
                  # On a C2C system NCCL asks for the PCIe mapping type where the NIC is
                  # on a PCIe path (nccl/decision.py gdr_mode "pci").
                  pcie_mapping=decision.gdr_mode == "pci", reasons=direction_reasons(decision),
                  mechanism=decision.mechanism, mechanism_reason=decision.mechanism_reason,
                  data_direct=decision.data_direct is not None,
                  **flush_fields(context.flush_of(decision) if context.flush_of else None))
    if uses_gdr(decision):
        return NcclUse(**common)

    def would_use(env: Mapping[str, str]) -> bool:
        return uses_gdr(decisions.under(env).get(bdf))
    cause = why_not(decision)
    if would_use(without(environ, nccl_names(environ))) or context.refusal and not context.firm:
        return setting_caused(common, cause, culprits(environ, would_use, context.source))
    if decision.unread:
        return NcclUse(**common, cause=decision.unread, fix=UNREAD_FIX)
    if would_use({**environ, **OPT_IN_SETTINGS}):
        return NcclUse(**common, cause=f"NCCL's default: {cause}", fix=opt_in_fix())
    return NcclUse(**common, cause=cause, node_fault=True, fix=node_fix(bdf, context.findings))


def opt_in_fix() -> str:
    """What a job sets to get GPUDirect where NCCL leaves it off by design."""
    settings = ", ".join(f"{name}={value}" for name, value in OPT_IN_SETTINGS.items())
    return (f"if this job should use GPUDirect RDMA, set {settings} (NCCL leaves it off by default here); "
            "otherwise nothing is wrong with the node")


def environment_use(environ: Mapping[str, str], source: Callable[[str], str],
                    rules: NcclRules | None = None) -> NcclUse | None:
    """Where NCCL's environment alone keeps every GPU off GPUDirect (whatever the topology),
    the answer for any GPU of the job, also one the doctor could not place or identify
    (``gpu`` is left empty for the caller to fill in); else None. The settings are the cause."""
    refusal = environment_refusal(environ, rules)
    if refusal is None:
        return None

    def would_use(env: Mapping[str, str]) -> bool:
        return environment_refusal(env, rules) is None
    path = SOCKET_PATH if transport_refusal(environ, rules) else "none"
    common = dict(gpu="", nic=None, path=path, via_gpu=None, receives=False, sends=False,
                  firm=True, reasons=(f"receive: {refusal}", f"send: {refusal}"))
    return setting_caused(common, refusal, culprits(environ, would_use, source))


def node_use(facts: NodeFacts, environ: Mapping[str, str], rules: NcclRules | None = None,
             findings: Sequence = ()) -> NcclUse | None:
    """Where the node keeps NCCL off its IB transport whatever the topology (a data-direct
    lookup error, :func:`gdrprobe.nccl.data_direct.ib_init_failure`), the answer for any GPU
    of the job, also one the doctor could not place (``gpu`` left empty); else None. The
    node is the cause; the fix is nccl.data_direct's."""
    refusal = data_direct.ib_init_failure(rules or NcclRules(), environ, facts.data_direct_errors, facts.ports)
    if refusal is None:
        return None
    fixes = [f.fix for f in findings if f.id == finding_ids.NCCL_DATA_DIRECT and f.fix]
    return NcclUse(gpu="", nic=None, path=SOCKET_PATH, via_gpu=None, receives=False, sends=False, firm=True,
                   reasons=(f"receive: {refusal}", f"send: {refusal}"), cause=refusal, node_fault=True,
                   fix=fixes[0] if fixes else "run 'gdrprobe doctor': its nccl.data_direct finding says what to fix")


def nccl_uses(decide: Decide, environ: Mapping[str, str], source: Callable[[str], str],
              firm: bool, findings: Sequence = (), rules: NcclRules | None = None,
              flush_of: Callable[[NcclGpuDecision], NcclFlush] | None = None) -> dict[str, NcclUse]:
    """For every GPU (by PCI bus id) NCCL's decision under ``environ`` (the environment as
    NCCL sees it, configuration files included) and, where GPUDirect is off, its cause.
    firm: the facts the decision rests on were read (the CUDA driver answered); flush_of:
    NCCL's flush of a GPUDirect receive into the decision's GPU."""
    decisions = Decisions(decide)
    context = UseContext(source, firm, findings, rules, environment_refusal(environ, rules), flush_of)
    return {bdf: decided_use(decision, environ, decisions, context)
            for bdf, decision in decisions.under(environ).items()}


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


def as_nccl_registers(memory: MemorySpec, use: NcclUse | None, rules: NcclRules | None = None,
                      environ: Mapping[str, str] | None = None) -> MemorySpec:
    """A GPU buffer whose mechanism was left to gdrprobe (``--mem gpu``) registered as NCCL
    registers it: through the mechanism NCCL's decision names, with its rule and release as
    the reason. An explicit mechanism, host memory, memory NCCL never registers (managed,
    pinned host), or no GDR in NCCL's decision: as is. Any DMA-BUF (auto or asked) on the
    face of a data-direct NIC NCCL registers on (:func:`with_nccl_face`)."""
    if (memory.kind == "gpu" and memory.mechanism == "auto" and memory.memory_type == GPUDIRECT_PROOF_MEMORY
            and use is not None and use.mechanism is not None):
        memory = dataclasses.replace(memory, mechanism=use.mechanism, reason=use.mechanism_reason)
    return with_nccl_face(memory, use, rules, environ or {})


def with_nccl_face(memory: MemorySpec, use: NcclUse | None, rules: NcclRules | None,
                   environ: Mapping[str, str]) -> MemorySpec:
    """A DMA-BUF registration (asked, or left to gdrprobe) on a data-direct NIC made on the
    face NCCL registers on (:func:`gdrprobe.nccl.data_direct.nccl_face`): the decision's
    device for this GPU where there is one, else the release's and environment's."""
    if memory.kind != "gpu" or memory.mechanism not in ("auto", "dmabuf"):
        return memory
    decided = None if use is None or use.nic is None else use.data_direct
    face, why = data_direct.nccl_face(rules or NcclRules(), environ, decided)
    return dataclasses.replace(memory, nic_face=face, nic_face_reason=why)
