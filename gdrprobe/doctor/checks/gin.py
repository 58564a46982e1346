"""GPU-initiated networking: per GPU and the NIC NCCL gives it, the mode NCCL's GIN takes
(the GPU rings the NIC's doorbell, a CPU thread rings it, or no GIN) with the reason and the
fix (:mod:`gdrprobe.nccl.gin`), and the same for NVSHMEM's IBGDA where the job sets its
variables (:mod:`gdrprobe.nccl.ibgda`); the driver settings both depend on.

How loud each finding is follows what the job will do: a job that asked for GIN explicitly
(NCCL_GIN_ENABLE=1, NCCL_GIN_TYPE, NVSHMEM_IB_ENABLE_IBGDA=1) and that this node cannot
serve GPU-initiated fails; one that did not ask warns only where this node could be fixed
(the registry key, nvidia-peermem), and is told the rest as information. Whether the driver
really maps the doorbell only the registration answers: ``gdrprobe check --gin`` makes it.
"""

from __future__ import annotations

import functools

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.gin import PARAMS_FILE, gin_gpu, gin_nic
from gdrprobe.nccl.gin import BLAME_NODE, GPU_INITIATED, REGISTRY_FIX, GinMode, GinNic, doorbell_prediction, gin_mode
from gdrprobe.nccl.ibgda import NVSHMEM, ibgda_asked, ibgda_mode
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status

GROUP = ids.GIN
finding = functools.partial(Finding, group=GROUP)
PROVE = "gdrprobe check --gin makes the registration and answers"
NVIDIA = "cuda"      # GIN and IBGDA are NCCL's and NVSHMEM's: the CUDA runtime's node only


def gin_modes(ctx: DoctorContext) -> dict[str, GinMode]:
    """GPU bus id -> the mode NCCL's GIN takes for it through the NIC NCCL gives it (none on
    another runtime's node)."""
    if ctx.runtime.key != NVIDIA:
        return {}
    node = ctx.gin_node
    return {decision.gpu_bdf: gin_mode(node, gin_gpu(ctx, decision.gpu_bdf), _nic(ctx, decision))
            for decision in ctx.nccl_decisions}


def ibgda_modes(ctx: DoctorContext) -> dict[str, GinMode]:
    """GPU bus id -> NVSHMEM IBGDA's doorbell handler, where the job sets IBGDA's variables."""
    if ctx.runtime.key != NVIDIA or not ibgda_asked(ctx.environ):
        return {}
    node = ctx.gin_node
    return {decision.gpu_bdf: ibgda_mode(node, gin_gpu(ctx, decision.gpu_bdf), _nic(ctx, decision))
            for decision in ctx.nccl_decisions}


def _nic(ctx: DoctorContext, decision) -> GinNic:
    return gin_nic(ctx, decision) if decision.nic else GinNic(name=None)


def status_of(mode: GinMode) -> Status:
    """FAIL where the job asked for GPU-initiated networking and this node cannot give it; WARN
    where the job asked and a setting keeps it off, or where this node could be fixed; else
    information (NCCL's defaults on a node that was never meant to)."""
    if mode.mode == GPU_INITIATED:
        return Status.OK
    if mode.asked and mode.blame == BLAME_NODE:
        return Status.FAIL
    if mode.asked or (mode.blame == BLAME_NODE and mode.fix):
        return Status.WARN
    return Status.INFO


def mode_finding(finding_id: str, library: str, mode: GinMode) -> Finding:
    backend = f" ({mode.backend})" if mode.backend else ""
    via = f" through {mode.nic}" if mode.nic else ""
    asked = f"; the job asked for it ({mode.asked})" if mode.asked else ""
    proof = f"; {PROVE}" if mode.registration_decides else ""
    return finding(id=finding_id, status=status_of(mode),
                   summary=f"{library} for GPU {mode.gpu}{via}: {mode.mode}{backend}: {mode.reason}{asked}{proof}",
                   evidence=(Evidence(mode.release, f"{mode.mode}{backend}"),),
                   fix=mode.fix)


def params_finding(ctx: DoctorContext, modes: list[GinMode]) -> Finding:
    node = ctx.gin_node
    mapped, why = doorbell_prediction(node)
    evidence = (Evidence(PARAMS_FILE, node.params.describe()), Evidence("architecture", node.arch or "unknown"))
    memops = ("" if node.params.stream_memops is None else
              f"; EnableStreamMemOPs={node.params.stream_memops} (NVSHMEM's cuStreamWaitValue64 _v2 entry points "
              "do not need it: NVIDIA/nvshmem issue 23, deepseek-ai/DeepEP issue 484)")
    asked_for = [mode for mode in modes if mode.registration_decides]
    if mapped is False:
        return finding(id=ids.GIN_DRIVER_PARAMS, status=Status.WARN if asked_for else Status.INFO,
                       summary=f"the GPU may not map a NIC's doorbell: {why}, which the NVSHMEM IBGDA and DeepEP "
                               "setup guides ask for on x86 so that cuMemHostRegister(IOMEMORY) of a NIC's "
                               f"doorbell succeeds{memops}",
                       evidence=evidence, fix=REGISTRY_FIX)
    return finding(id=ids.GIN_DRIVER_PARAMS, status=Status.OK if mapped else Status.INFO,
                   summary=f"{why}{memops}", evidence=evidence)


def check(ctx: DoctorContext) -> list[Finding]:
    if ctx.runtime.key != NVIDIA or not ctx.topology.gpus:
        return [finding(id=ids.GIN_NODE, status=Status.SKIP,
                        summary="no NVIDIA GPU: NCCL's GIN and NVSHMEM's IBGDA have nothing to run on",
                        evidence=(Evidence("topology", "no NVIDIA GPU"),))]
    if ctx.driver_line is None:
        return [finding(id=ids.GIN_NODE, status=Status.SKIP,
                        summary="no NVIDIA kernel driver is loaded: whether the GPU can ring a NIC's doorbell "
                                "cannot be told", evidence=(Evidence(PARAMS_FILE, "absent"),))]
    modes = gin_modes(ctx)
    nvshmem = ibgda_modes(ctx)
    findings = [params_finding(ctx, list(modes.values()) + list(nvshmem.values()))]
    findings += [mode_finding(ids.gin_gpu(bdf), "NCCL GIN", mode) for bdf, mode in modes.items()]
    findings += [mode_finding(ids.gin_nvshmem(bdf), NVSHMEM, mode) for bdf, mode in nvshmem.items()]
    if not modes:
        findings.append(finding(id=ids.GIN_NODE, status=Status.INFO,
                                summary="no GPU has a decision by NCCL's rules, so no GIN mode is told",
                                evidence=(Evidence("nccl decisions", "none"),)))
    return findings

