"""What the campaigns know about the machine they run on, read once by the doctor: its
findings, its GPUs, the NIC NCCL will use for each GPU and whether NCCL will use GPUDirect
RDMA for it, the environment as NCCL sees it, and each RDMA port's rate and link layer;
and which of the findings speak for which buffer.

The doctor speaks for the GPU buffers of the host it ran on. A client's A/B takes this
host's findings when a GPU buffer is here (its own, or in loopback the server's too); a
server hands its clients the findings about its own GPU buffer, and only those the verdict
can name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gdrprobe.campaign.gate import GpuFacts, MachineFacts, NicChoice, PortFacts
from gdrprobe.campaign.job_gpus import gpu_uuids
from gdrprobe.campaign.nccl_use import deciding, nccl_uses
from gdrprobe.campaign.verdict import speaks_to_verdict


def machine_facts(root: str = "/", environ: Mapping[str, str] | None = None) -> MachineFacts:
    """The doctor's findings and the facts the choice of GPU and NIC rests on, read once
    (root and environ: a captured machine)."""
    from gdrprobe.doctor.facts.context import DoctorContext
    from gdrprobe.doctor.runner import run_checks
    from gdrprobe.sysroot import SysRoot

    ctx = DoctorContext(SysRoot(root), environ)
    findings = run_checks(ctx)
    bus_ids = [gpu.bdf for gpu in ctx.topology.gpus]
    gpus = GpuFacts.from_doctor(ctx.cuda_facts, bus_ids, gpu_uuids(ctx.root, bus_ids))
    uses = nccl_uses(deciding(ctx.nccl_node, ctx.nccl_rules), ctx.environ, ctx.environ_source,
                     firm="gpus" in (ctx.cuda_facts or {}), findings=findings)
    return MachineFacts(gpus, nccl_nics(ctx.nccl_decisions), ctx.cuda_facts,
                        ctx.driver_line, findings, uses, dict(ctx.environ),
                        port_facts(ctx.ports), ctx.topology.software_nics)


def port_facts(ports: Mapping[str, Sequence]) -> dict[tuple[str, int], PortFacts]:
    """Every RDMA device's ports (software devices too, which NCCL's facts leave out) as the
    doctor read them once (DoctorContext.ports): the rate and link layer sysfs states."""
    return {(device, port.number): PortFacts(port.rate_gbps, port.link_layer)
            for device, listed in ports.items() for port in listed}


def nccl_nics(decisions) -> dict:
    """GPU bus id -> the NIC NCCL will use for it and why, as the doctor decides it by
    NCCL's rules (NCCL_IB_HCA honoured)."""
    return {decision.gpu_bdf: NicChoice(decision.nic, "NCCL's choice: " + decision.why[0])
            for decision in decisions if decision.nic is not None}


def holds_gpu_buffer(local, loopback: bool) -> bool:
    """Whether a GPU buffer of the run is on this host: the local one, or in loopback the
    server's as well (both ends are here)."""
    return loopback or local.kind == "gpu"


def doctor_findings(local, loopback: bool) -> tuple:
    """This host's findings when they speak for a buffer of the run, else none (the doctor
    is not run at all: a host-only run needs nothing of it)."""
    if not holds_gpu_buffer(local, loopback):
        return ()
    from gdrprobe.doctor.runner import run_doctor

    return run_doctor().findings


def findings_to_serve(findings: Sequence) -> tuple:
    """What a server sends about its GPU buffer: the findings the verdict can name."""
    return tuple(finding for finding in findings if speaks_to_verdict(finding.id))


def served_findings() -> tuple:
    """A server's findings for its clients, read from this host."""
    from gdrprobe.doctor.runner import run_doctor

    return findings_to_serve(run_doctor().findings)
