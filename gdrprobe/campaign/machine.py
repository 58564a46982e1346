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
from gdrprobe.campaign.nccl_use import deciding, nccl_uses
from gdrprobe.campaign.verdict import speaks_to_verdict
from gdrprobe.errors import GpuUnusable
from gdrprobe.nccl.flush import gpu_flush
from gdrprobe.report import finding_ids
from gdrprobe.report.model import Status


def machine_facts(root: str = "/", environ: Mapping[str, str] | None = None) -> MachineFacts:
    """The doctor's findings and the facts the choice of GPU and NIC rests on, read once
    (root and environ: a captured machine)."""
    from gdrprobe.doctor.facts.context import DoctorContext
    from gdrprobe.doctor.runner import run_checks
    from gdrprobe.sysroot import SysRoot

    ctx = DoctorContext(SysRoot(root), environ)
    findings = run_checks(ctx)
    gpus = GpuFacts.from_doctor(ctx.cuda_facts, [gpu.bdf for gpu in ctx.topology.gpus])
    uses = nccl_uses(deciding(ctx.nccl_node, ctx.nccl_rules), ctx.environ, ctx.environ_source,
                     firm="gpus" in (ctx.cuda_facts or {}), findings=findings,
                     flush_of=receive_flush_of(ctx))
    return MachineFacts(gpus, nccl_nics(ctx.nccl_decisions), ctx.cuda_facts,
                        ctx.driver_line, findings, uses, dict(ctx.environ),
                        port_facts(ctx.ports), ctx.topology.software_nics)


def receive_flush_of(ctx):
    """NCCL's flush of a GPUDirect receive into a decision's GPU, by the rules of the NCCL
    the job loads. The A/B's GPU arm receives through GPUDirect whatever NCCL decides, so it
    is asked as for such a receive."""
    def flush_of(decision):
        return gpu_flush(decision, ctx.nccl_node, ctx.environ, ctx.nccl_rules.version,
                         receives=True)
    return flush_of


def require_cuda_gpus(facts: MachineFacts) -> None:
    """Raises GpuUnusable (exit 11, drain) where the doctor found GPUs the PCI bus has lost
    to CUDA (a failing ``gpu.cuda``: :func:`gdrprobe.doctor.checks.gpu.cuda_gpu_fault`): a
    job started here meets the same driver, so the gate answers before measuring."""
    for finding in facts.findings:
        if (getattr(finding, "id", None) == finding_ids.GPU_CUDA
                and finding.status is Status.FAIL):
            raise GpuUnusable(finding.summary, finding.fix,
                              evidence="; ".join(item.value for item in finding.evidence))


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
