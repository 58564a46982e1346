"""What the campaigns know about the machine they run on, read once by the doctor: its
findings, its GPUs, the NIC NCCL will use for each GPU and whether (and through which
registration) NCCL will use GPUDirect RDMA for it, the environment as NCCL sees it and the
rules of the NCCL the job loads, and each RDMA port's rate and link layer; and which of the
findings speak for which buffer.

The doctor speaks for the GPU buffers of the host it ran on. A client's A/B takes this
host's findings when a GPU buffer is here (its own, or in loopback the server's too); a
server hands its clients the findings about its own GPU buffer, and only those the verdict
can name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gdrprobe.campaign.gate import GpuFacts, MachineFacts, NicChoice, PortFacts
from gdrprobe.campaign.communicator import Communicator
from gdrprobe.campaign.job_gpus import gpu_uuids
from gdrprobe.campaign.nccl_use import as_nccl_registers, deciding, environment_use, nccl_uses, node_use
from gdrprobe.campaign.verdict import speaks_to_verdict
from gdrprobe.errors import GpuUnusable
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.nccl.flush import gpu_flush
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report import finding_ids
from gdrprobe.report.check import NcclUse
from gdrprobe.report.model import Status


def machine_facts(root: str = "/", environ: Mapping[str, str] | None = None,
                  job: Communicator | None = None) -> MachineFacts:
    """The doctor's findings and the facts the choice of GPU and NIC rests on, read once
    (root and environ: a captured machine). job: NCCL's communicator on this node as named
    (the job's GPUs: --gpu, SLURM_JOB_GPUS, ...; a rank's launcher's local ranks:
    campaign.communicator; None: every GPU), matched here, once, to this node's GPUs
    (MachineFacts.job): NCCL's rules count them."""
    from gdrprobe.doctor.facts.context import DoctorContext
    from gdrprobe.doctor.runner import run_checks
    from gdrprobe.sysroot import SysRoot

    ctx = DoctorContext(SysRoot(root), environ)
    findings = run_checks(ctx)
    bus_ids = [gpu.bdf for gpu in ctx.topology.gpus]
    gpus = GpuFacts.from_doctor(ctx.gpu_facts, bus_ids, gpu_uuids(ctx.root, bus_ids))
    matched = job.matched(gpus) if job is not None else None
    # None: every GPU of the node (no job named, or none of its GPUs is here)
    job_gpus = (matched.bus_ids or None) if matched is not None else None
    decide = deciding(ctx.nccl_node, ctx.nccl_rules, job_gpus)
    uses = nccl_uses(decide, ctx.environ, ctx.environ_source, firm="gpus" in (ctx.gpu_facts or {}),
                     findings=findings, rules=ctx.nccl_rules, flush_of=receive_flush_of(ctx))
    decisions = ctx.nccl_decisions if job_gpus is None else decide(ctx.environ)
    return MachineFacts(gpus, nccl_nics(decisions), ctx.cuda_facts,
                        ctx.driver_line, findings, uses, dict(ctx.environ),
                        port_facts(ctx.ports), ctx.topology.software_nics, ctx.nccl_rules,
                        environment_use(ctx.environ, ctx.environ_source, ctx.nccl_rules)
                        or node_use(ctx.nccl_node, ctx.environ, ctx.nccl_rules, findings),
                        ctx.topology, every_link(ctx), matched, **gin_facts(ctx))


def gin_facts(ctx) -> dict:
    """GIN's and IBGDA's modes per GPU, as the doctor's gin check decided them (none on a node
    of another runtime than CUDA's); none where deciding them crashed (the findings already say
    so: gin.crashed)."""
    from gdrprobe.doctor.checks.gin import gin_modes, ibgda_modes

    try:
        return {"gin": gin_modes(ctx), "ibgda": ibgda_modes(ctx)}
    except Exception:  # noqa: BLE001 - reported as gin.crashed by run_checks
        return {}


def every_link(ctx):
    """The negotiated link of each port between any GPU and any NIC of the node."""
    from gdrprobe.doctor.facts.rails import Rail, read_links

    topology = ctx.topology
    return read_links(ctx.root, [Rail(gpu, nic) for gpu in topology.gpus for nic in topology.nics])


def nccl_use_of(facts: MachineFacts, gpu: str) -> NcclUse | None:
    """NCCL's decision for a GPU of this host (a bus id or a CUDA ordinal): the doctor's for
    that GPU, else, where NCCL's environment alone decides, that answer (a GPU the doctor
    could not place or identify: a VM or container without its PCI function, no CUDA facts)."""
    bdf = facts.gpus.bus_id(gpu)
    found = facts.nccl.get(bdf)
    if found is None and facts.nccl_everywhere is not None:
        return dataclasses.replace(facts.nccl_everywhere, gpu=bdf)
    return found


def nccl_view(root: str = "/", environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], NcclRules]:
    """The environment as NCCL sees it (the process's, then its configuration files) and the
    rules of the NCCL the job loads, without running the doctor's checks: what a host-memory
    run needs of NCCL (its relaxed-ordering setting)."""
    from gdrprobe.doctor.facts.context import DoctorContext
    from gdrprobe.sysroot import SysRoot

    ctx = DoctorContext(SysRoot(root), environ)
    return dict(ctx.environ), ctx.nccl_rules


def follow_nccl(memory: MemorySpec, facts: MachineFacts | None) -> MemorySpec:
    """A buffer of this host registered as NCCL registers that GPU's memory where the
    mechanism is left to gdrprobe (:func:`gdrprobe.campaign.nccl_use.as_nccl_registers`)."""
    if facts is None or memory.kind != "gpu":
        return memory
    return as_nccl_registers(memory, nccl_use_of(facts, memory.gpu), facts.nccl_rules, facts.nccl_environ)


def receive_flush_of(ctx):
    """NCCL's flush of a GPUDirect receive into a decision's GPU, by the rules of the NCCL
    the job loads. The A/B's GPU arm receives through GPUDirect whatever NCCL decides, so it
    is asked as for such a receive."""
    def flush_of(decision):
        return gpu_flush(decision, ctx.nccl_node, ctx.environ, ctx.nccl_rules.version,
                         receives=True)
    return flush_of


def require_gpus(facts: MachineFacts) -> None:
    """Raises GpuUnusable (exit 11, drain) where the doctor found GPUs the PCI bus holds that
    the node's GPU runtime lost (a failing ``gpu.<runtime>``, ``gpu.cuda`` or ``gpu.rocm``:
    :func:`gdrprobe.doctor.checks.gpu.runtime_gpu_fault`): a job started here meets the same
    driver, so the gate answers before measuring."""
    from gdrprobe.memory.runtime import runtimes

    lost = {finding_ids.gpu_runtime(runtime.key) for runtime in runtimes()}
    for finding in facts.findings:
        if getattr(finding, "id", None) in lost and finding.status is Status.FAIL:
            raise GpuUnusable(finding.summary, finding.fix,
                              evidence="; ".join(item.value for item in finding.evidence))


def port_facts(ports: Mapping[str, Sequence]) -> dict[tuple[str, int], PortFacts]:
    """Every RDMA device's ports (software devices too, which NCCL's facts leave out) as the
    doctor read them once (DoctorContext.ports): the rate and link layer sysfs states."""
    return {(device, port.number): PortFacts(port.rate_gbps, port.link_layer)
            for device, listed in ports.items() for port in listed}


NCCL_CHOICE = "NCCL's choice: "     # a NIC reason that is NCCL's decision


def nccl_nics(decisions) -> dict:
    """GPU bus id -> the NIC NCCL will use for it and why, as the doctor decides it by
    NCCL's rules (NCCL_IB_HCA honoured)."""
    return {decision.gpu_bdf: NicChoice(decision.nic, NCCL_CHOICE + decision.why[0])
            for decision in decisions if decision.nic is not None}


def holds_gpu_buffer(local, loopback: bool) -> bool:
    """Whether a GPU buffer of the run is on this host: the local one, or in loopback the
    server's as well (both ends are here)."""
    return loopback or local.kind == "gpu"


def run_facts(local, loopback: bool) -> MachineFacts | None:
    """This host's facts when they speak for a buffer of the run (its findings, NCCL's
    decision for the GPU), else None (the doctor is not run at all: a host-only run needs
    nothing of it)."""
    return machine_facts() if holds_gpu_buffer(local, loopback) else None


def findings_to_serve(findings: Sequence) -> tuple:
    """What a server sends about its GPU buffer: the findings the verdict can name."""
    return tuple(finding for finding in findings if speaks_to_verdict(finding.id))


def served_findings() -> tuple:
    """A server's findings for its clients, read from this host."""
    from gdrprobe.doctor.runner import run_doctor

    return findings_to_serve(run_doctor().findings)
