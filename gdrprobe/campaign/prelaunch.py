"""The prelaunch gate for one GPU (``gdrprobe check``, ``require()``): the A/B as NCCL will
move this GPU's bytes, inside the check's time budget.

- **Memory as NCCL places it.** GPU memory at both ends: the NIC reads the send buffer and
  writes the receive buffer (:mod:`gdrprobe.campaign.ab` then isolates a failing
  direction). With PXN (the doctor's decision says ``pxn``) NCCL copies this GPU's sends
  over NVLink into the peer GPU's memory and the peer's NIC reads them there
  (``src/transport/net.cc`` sendSetup: the proxy rank's buffers), while receives land in
  this GPU's own memory (recvSetup: "We don't support PXN on receive yet"); so the send
  side is the peer's GPU, the receive side this one.
- **NCCL's environment** (configuration files included): ``NCCL_IB_GID_INDEX`` picks the
  GID on RoCE ports, as ``src/transport/net_ib/connect.cc`` ncclIbGetGidIndex does (NCCL
  ignores it on InfiniBand), and without it ``NCCL_IB_ADDR_FAMILY``,
  ``NCCL_IB_ROCE_VERSION_NUM`` and ``NCCL_IB_ADDR_RANGE`` steer NCCL's walk of the GID
  table; ``NCCL_IB_PCI_RELAXED_ORDERING`` the registration (the API's options); NCCL's
  decision whether to use GPUDirect at all (:func:`verdict.with_nccl`).
- **NCCL's flush**: the receiver reads back each check's last message with an RDMA READ
  before checking it where NCCL flushes this GPU's receives, or NCCL's decision is unknown
  (:func:`gdrprobe.campaign.nccl_use.receive_flush`, :mod:`gdrprobe.nccl.flush`).
- **The floor**: the deciding arm against the port's line rate, where the kernel states
  it and the NIC is hardware.
- **One A/B per NIC at a time** (:mod:`gdrprobe.campaign.nic_lock`).
- **Other traffic on the port** during the runs, by the port's own counters against what
  the runs put on the wire (:mod:`gdrprobe.campaign.port_traffic`), makes a measured answer
  inconclusive (exit 12) instead of degraded (:func:`verdict.disturbed`).
- **The extra answers** asked for (``check --latency``, ``--read``, ``--bidir``), on an
  engaged answer only, on the same NIC under the same lock: the latency A/B (WRITE with
  immediate, sent from host memory as NCCL's LL protocol sends, received into host memory
  against the check's GPU memory), the A/B with WRITEs out of GPU memory into host memory
  (the NIC reading GPU memory as NCCL's sends) and the A/B with both ends WRITEing at once
  (:mod:`gdrprobe.campaign.secondary` decides; a shortfall warns, exit 13).
- **A GPU another process holds** (``CUDA_ERROR_DEVICE_UNAVAILABLE``: exclusive-process
  compute mode with another process on it, or prohibited) is a fault the job meets, exit 11,
  when it is the checked GPU, or in a node check (the job has not started) one of the job's;
  any other GPU the check opens (PXN's peer for the sends) is not the job's to judge by:
  exit 12 (:func:`held_elsewhere`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable
from collections.abc import Mapping

from gdrprobe import defaults
from gdrprobe.campaign.ab import ARM_ERRORS, HOST, StopSampling, ab_test, no_device_not_testable
from gdrprobe.campaign.gate import Budget, MachineFacts, RunOnce, budgeted, rank_pair, sized_for_budget
from gdrprobe.campaign.communicator import communicator
from gdrprobe.campaign.latency_ab import latency_ab
from gdrprobe.campaign import memlock, nccl_pattern, secondary
from gdrprobe.campaign.machine import NCCL_CHOICE, holds_gpu_buffer, nccl_use_of
from gdrprobe.campaign.nccl_use import as_nccl_registers, receive_flush
from gdrprobe.campaign.nic_lock import nic_lock
from gdrprobe.campaign.plan import CheckPlan, Criteria, read_machine
from gdrprobe.campaign.port_traffic import PortWatch
from gdrprobe.campaign.verdict import disturbed, with_nccl
from gdrprobe.errors import (ExitCode, GdrprobeError, GpuUnusable, Inconclusive, NcclSetting,
                             NoRdmaDevice, NotTestable, VerdictNotOk)
from gdrprobe.measure.options import MIN_TIMEOUT_S, ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.nccl import gid as gids
from gdrprobe.nccl.pattern import transport_settings
from gdrprobe.rdma.endpoint import EndpointOptions
from gdrprobe.report.check import (NOT_TESTABLE, CheckReport, FloorCheck, LoopWindow, NcclUse,
                                   RankPair, Verdict, main_cause)
from gdrprobe.report.nccl_pattern import NcclPatternCheck
from gdrprobe.sysroot import PCI_BUS_ID

MIN_BIDIR_WINDOW_S = 0.1   # a window for the bidirectional runs where the check set none

# What a check keeps of its budget for the runs when it waits for a NIC another check
# holds: the first run may start only with the shortest out-of-band time-out left, the
# second likewise (gate.budgeted).
LOCK_RESERVE_S = 2 * MIN_TIMEOUT_S


def floor_check(nic: str, port: int, facts: MachineFacts, floor: float) -> FloorCheck:
    """The port's line rate and whether the floor applies to it (floor: checked when the
    plan was made, before the doctor ran: Criteria.asked)."""
    rate = facts.line_rate(nic, port)
    software = True if nic in facts.software_nics else (False if (nic, port) in facts.ports else None)
    if software:
        note = ("not applied: a software RDMA device (rxe, siw), where the CPU copies every "
                "byte, so it can never do GPUDirect RDMA")
    elif rate is None:
        note = f"not applied: the kernel states no line rate for {nic} port {port}"
    elif floor == 0:
        note = "not applied: --floor 0"
    else:
        note = f"{floor:.2f} of {rate:g} Gb/s = {floor * rate:.0f} Gb/s"
    return FloorCheck(nic, port, rate, floor, applied=bool(rate) and not software and floor > 0,
                      software_device=software, note=note)


def nccl_gid_index(facts: MachineFacts, nic: str, port: int) -> int | None:
    """The GID index NCCL takes on a RoCE port without a walk (NCCL_IB_GID_INDEX, by the job's
    release: :func:`gdrprobe.nccl.gid.stated_gid_index`); None: InfiniBand, or NCCL walks the
    table and gdrprobe chooses (a RoCE v2 IPv4 GID, NCCL's walk where there is none)."""
    stated = facts.ports.get((nic, port))
    if stated is None or stated.link_layer != "Ethernet":
        return None
    return gids.stated_gid_index(facts.nccl_environ, facts.nccl_rules)


def first_rdma_device() -> str:
    """The device a check without NCCL's choice uses: the first libibverbs lists."""
    from gdrprobe.rdma import verbs

    try:
        return verbs.resolve_device(None)
    except NoRdmaDevice as error:
        raise no_device_not_testable(error) from error


def send_gpu(pair: RankPair, use: NcclUse | None,
             visible: tuple[str, ...] | None) -> tuple[str | None, str]:
    """The GPU whose memory the NIC reads for this GPU's sends, and why; None: not one this
    process can open (host memory stands in, and the reason says what is not measured)."""
    if use is None or use.path != "pxn" or not use.via_gpu or pair.nic != use.nic:
        return pair.gpu, "this GPU (NCCL sends from its own memory)"
    why = (f"PXN: NCCL copies this GPU's sends over NVLink into {use.via_gpu}'s memory and "
           f"{use.nic} reads them there (net.cc sendSetup); receives stay in this GPU's "
           "memory (no PXN on receive)")
    if visible is not None and use.via_gpu not in visible:
        return None, (f"{why}; {use.via_gpu} is not visible to this process "
                      "(CUDA_VISIBLE_DEVICES), so the sends' memory is not measured: "
                      "'gdrprobe check --node' measures it")
    return use.via_gpu, why


def as_nccl_exports(memory: MemorySpec, use: NcclUse | None, facts: MachineFacts) -> MemorySpec:
    """A GPU buffer registered and exported as NCCL will: through NCCL's mechanism where
    --mem gpu leaves it open (nccl_use.as_nccl_registers), with the PCIe mapping type where
    NCCL asks for it (a C2C system's GPU on a PCIe path to its NIC)."""
    memory = as_nccl_registers(memory, use, facts.nccl_rules, facts.nccl_environ)
    if memory.kind != "gpu" or use is None or not use.pcie_mapping:
        return memory
    return dataclasses.replace(memory, pcie_mapping=True)


def planned_runs(gate: CheckPlan, two_ended: bool) -> int:
    """The most runs the A/B can make: the host arm and each deciding arm per repeat, and
    with GPU memory at both ends the two one-direction arms' repeats; the extra answers'
    two arms per repeat each."""
    repeats = gate.criteria.repeats
    extras = 2 * repeats * len(gate.criteria.answers)
    return repeats * (2 + gate.staged) + (3 * repeats if two_ended else 0) + extras


def latency_options(options: ProbeOptions) -> ProbeOptions:
    """The latency A/B's runs: a ping-pong of WRITEs with immediate at small sizes, one QP,
    a fixed count (perftest's ib_write_lat --write_with_imm), with the buffers where NCCL's
    LL protocol, which carries small messages, puts them (campaign/secondary.py): each side
    sends from host memory and receives into the memory asked for, its data posted without
    inline, and no flush (NCCL flushes SIMPLE receives only)."""
    return dataclasses.replace(options, mode="latency", opcode="write_imm",
                               sizes=defaults.CHECK_LATENCY_SIZES,
                               iterations=defaults.CHECK_LATENCY_ITERATIONS, duration_s=None,
                               window_bytes=None, qps=1, tx_depth=1, cq_moderation=1,
                               post_list=1, flush="", send_memory="host", inline_size=0)


def bidir_options(options: ProbeOptions, host_gbps: float) -> ProbeOptions:
    """The bidirectional A/B's runs: the check's (NCCL's flush too: each side receives into
    GPU memory), both sides WRITEing at once for a number of iterations (a bidirectional run
    checks every message, so it has no duration): as many as the WRITE A/B's host arm moved
    per QP in one of its windows, at least 10."""
    size, window_s = max(options.sizes), options.duration_s or MIN_BIDIR_WINDOW_S
    iterations = int(host_gbps * 1e9 / 8 * window_s / size / options.qps)
    return dataclasses.replace(options, bidir=True, duration_s=None,
                               window_bytes=None, iterations=max(10, iterations))


@dataclasses.dataclass(frozen=True)
class AnswerRun:
    """What every extra answer is measured from, after the WRITE A/B: the plan, the WRITE
    A/B's report, a runner for the check's options shaped for the answer's runs, the memory
    at both ends, the floor and the findings; the machine and the NIC (NCCL's pattern: the
    connections NCCL opens on it)."""

    gate: CheckPlan
    write: CheckReport
    runner_for: Callable[[Callable[[ProbeOptions], ProbeOptions]], RunOnce]
    local: MemorySpec
    remote: MemorySpec
    floor: FloorCheck
    findings: tuple
    use: NcclUse | None = None   # NCCL's decision for this GPU, where known
    facts: MachineFacts | None = None
    nic: str = ""


def latency_answer(run: AnswerRun):
    """check --latency: the latency A/B and its answer; not run where the budget or the
    GPU arm cannot hold it (a corrupt payload stays the run's error)."""
    criteria = run.gate.criteria
    try:
        # NCCL's LL placement: each side's GPU buffer is one it receives into, and receives
        # land in the checked GPU's own memory (a PXN peer relays sends only: net.cc recvSetup).
        report = latency_ab(run.runner_for(latency_options), run.remote, run.remote,
                            criteria.repeats)
    except (StopSampling, *ARM_ERRORS) as error:
        return latency_not_run(criteria, f"the latency runs stopped: {error}")
    return secondary.latency_check(report, criteria.latency_factor,
                                   criteria.latency_factor_source)


def latency_not_run(criteria: Criteria, why: str):
    return secondary.latency_not_run(criteria.latency_factor, criteria.latency_factor_source, why)


def read_answer(run: AnswerRun):
    """check --read: the A/B again with WRITEs out of GPU memory into host memory (the NIC
    reading GPU memory as the source of NCCL's sends: NCCL_NET_GDR_READ); not run where
    NCCL's decision keeps this GPU's sends off GPUDirect."""
    unused = secondary.sends_not_used(run.use)
    if unused:
        return secondary.read_not_run(unused)
    return a_b_answer(run, lambda options: options, secondary.READ_WHAT, remote=HOST)


def host_arm_gbps(write: CheckReport) -> float:
    """The WRITE A/B's host arm: the median of its repeats (0.0 where it measured none)."""
    host = write.host_arm()
    return (host.median_gbps if host else None) or 0.0


def bidir_answer(run: AnswerRun):
    """check --bidir: the A/B again with both ends WRITEing at once, each side as many
    messages as the WRITE A/B's host arm moved in one window."""
    host_gbps = host_arm_gbps(run.write)
    return a_b_answer(run, lambda options: bidir_options(options, host_gbps),
                      secondary.BIDIR_WHAT)


def pattern_answer(run: AnswerRun) -> NcclPatternCheck:
    """check --pattern nccl: the A/B again, each run NCCL's pattern after its stream at
    NCCL's step sizes, in the connections the job's NCCL settings open on this NIC
    (campaign.nccl_pattern); its GPU arm's pattern against the host arm's."""
    criteria, port = run.gate.criteria, run.gate.endpoint.port
    transport = transport_settings(run.facts.nccl_environ)
    stated = run.facts.ports.get((run.nic, port))
    shape = nccl_pattern.pattern_shape(transport,
                                       stated is not None and stated.link_layer == "InfiniBand",
                                       run.facts.line_rate(run.nic, port))
    host_gbps = host_arm_gbps(run.write)
    try:
        report = ab_test(run.runner_for(lambda options: nccl_pattern.check_options(
                             options, host_gbps, shape, transport)),
                         run.local, run.remote, repeats=criteria.repeats,
                         threshold=criteria.threshold, doctor_findings=run.findings,
                         min_repeats=min(2, criteria.repeats), floor=run.floor,
                         pattern=transport)
    except StopSampling as stop:
        return pattern_not_run(criteria, f"the NCCL-pattern runs stopped: {stop}")
    return report.pattern or pattern_not_run(criteria, report.verdict.classification)


def pattern_not_run(criteria: Criteria, why: str) -> NcclPatternCheck:
    return NcclPatternCheck(nccl_pattern.NOT_RUN, why)


def a_b_answer(run: AnswerRun, shape: Callable[[ProbeOptions], ProbeOptions], what: str,
               remote: MemorySpec | None = None):
    """The A/B again with the runs shaped for an answer, as the WRITE A/B ran (remote: the
    far end's memory where the answer puts it elsewhere), and its answer."""
    criteria = run.gate.criteria
    try:
        report = ab_test(run.runner_for(shape), run.local, remote or run.remote,
                         repeats=criteria.repeats, threshold=criteria.threshold,
                         doctor_findings=run.findings, min_repeats=min(2, criteria.repeats),
                         floor=run.floor)
    except StopSampling as stop:
        return secondary.read_not_run(f"the {what} runs stopped: {stop}")
    return secondary.read_check(report, what)


def a_b_not_run(criteria: Criteria, why: str):
    return secondary.read_not_run(why)


@dataclasses.dataclass(frozen=True)
class ExtraAnswer:
    measure: Callable[[AnswerRun], object]         # the answer, measured
    not_run: Callable[[Criteria, str], object]     # the answer where it is not measured, and why


# check's extra answers on an engaged node, in the order they run; each name is the door's
# keyword (Criteria.asked), the report's field (CheckReport) and what
# secondary.with_warnings is handed. A new answer is a row here (docs/ARCHITECTURE.md).
EXTRA_ANSWERS = {
    "latency": ExtraAnswer(latency_answer, latency_not_run),
    "read": ExtraAnswer(read_answer, a_b_not_run),
    "bidir": ExtraAnswer(bidir_answer, a_b_not_run),
    "pattern": ExtraAnswer(pattern_answer, pattern_not_run),   # joins the verdict
}


def extra_answers(gate: CheckPlan, write: CheckReport, runner_for, local: MemorySpec,
                  remote: MemorySpec, floor: FloorCheck, findings,
                  use: NcclUse | None = None, facts: MachineFacts | None = None,
                  nic: str = "") -> dict:
    """The extra answers asked for, as CheckReport fields: measured where the WRITE A/B is
    a conclusive "engaged" (write: its report, verdict as disturbed() left it), else each
    says why not; the sends' where NCCL's decision (use) keeps them off GPUDirect."""
    blocked = secondary.blocked_by(write.verdict)
    run = AnswerRun(gate, write, runner_for, local, remote, floor, findings, use, facts, nic)
    return {name: answer.not_run(gate.criteria, blocked) if blocked else answer.measure(run)
            for name, answer in EXTRA_ANSWERS.items() if gate.criteria.asks(name)}


# The CUresult of a GPU another process holds (exclusive-process) or no process may use
# (prohibited), as gdrprobe.memory.cuda_results names it in the error's evidence.
DEVICE_UNAVAILABLE = "CUDA_ERROR_DEVICE_UNAVAILABLE"


def held_gpu(error: GpuUnusable) -> str | None:
    """The bus id of the GPU a CUDA_ERROR_DEVICE_UNAVAILABLE is about: the evidence names
    the call, and a GPU's context calls name their GPU as sysfs spells it
    (memory.cuda.GpuDevice: cuDevicePrimaryCtxRetain(BUS)); None for any other error, or
    where no GPU is named."""
    evidence = (getattr(error, "evidence", "") or "").lower()
    if DEVICE_UNAVAILABLE.lower() not in evidence:
        return None
    found = PCI_BUS_ID.search(evidence)
    return found.group(0) if found else None


def held_elsewhere(error: GpuUnusable, checked: str, sender: str | None,
                   gate: CheckPlan) -> Inconclusive | None:
    """Inconclusive when the GPU another process holds is the one the check opened for the
    sends (PXN's peer, not the checked GPU) and not one of the job's (gate.job_gpus, a
    node check's); None: the error stands (exit 11): the checked GPU, or a GPU of the job."""
    gpu = held_gpu(error)
    if gpu is None or gpu != sender or sender == checked or gpu in (gate.job_gpus or ()):
        return None
    return Inconclusive(
        f"inconclusive: GPU {gpu}, which this check opened for {checked}'s sends (NCCL's PXN "
        "peer), is held by another process or closed to all (CUDA_ERROR_DEVICE_UNAVAILABLE), "
        "and it is not one of the job's GPUs: the check could not run, and that says "
        "nothing against this node",
        "check again when that GPU is free; 'nvidia-smi' shows the processes on it",
        evidence=error.evidence)


@dataclasses.dataclass(frozen=True)
class PairPlan:
    """What one GPU's runs use: its NIC and port, the memory at each end, the options."""

    nic: str
    nic_reason: str
    sender: str | None
    sender_why: str
    local: MemorySpec
    remote: MemorySpec
    endpoint: EndpointOptions
    options: ProbeOptions
    use: NcclUse | None


def plan_pair(pair: RankPair, facts: MachineFacts, gate: CheckPlan) -> PairPlan:
    """The NIC, memory and options of a GPU's runs, as NCCL will move its bytes."""
    use = nccl_use_of(facts, pair.gpu)
    nic = pair.nic or first_rdma_device()
    sender, sender_why = send_gpu(pair, use, facts.gpus.runtime_bus_ids)
    local = as_nccl_exports(gate.send.spec(sender) if sender is not None else HOST, use, facts)
    remote = as_nccl_exports(gate.receive.spec(pair.gpu), use, facts)
    port = gate.endpoint.port
    gid_index, nic_reason = gate.endpoint.gid_index, pair.nic_reason
    nccl_gid = nccl_gid_index(facts, nic, port)
    if gid_index is None and nccl_gid is not None:
        gid_index = nccl_gid
        stated = gids.why_stated(facts.nccl_environ, facts.nccl_rules)
        nic_reason += f"; GID index {gid_index}, as {facts.nccl_rules.name} takes it ({stated})"
    endpoint = dataclasses.replace(gate.endpoint, device=nic, gid_index=gid_index,
                                   gid_preference=gids.gid_preference(facts.nccl_environ, facts.nccl_rules))
    options = dataclasses.replace(gate.options, flush=receive_flush(use))
    return PairPlan(nic, nic_reason, sender, sender_why, local, remote, endpoint, options, use)


def rail_loop(facts: MachineFacts, gate: CheckPlan, seconds: float,
              environ: Mapping[str, str]) -> Callable[..., LoopWindow]:
    """loop(pair, host, ready) -> LoopWindow: one run of a rail's GPU arm (host: the host
    arm) sized to ``seconds``, holding its NIC's lock, that calls ready() once set up and
    records its last size's measured window on the monotonic clock: it ends when the
    result comes back (the integrity pause and the loop's own time before it)."""
    from gdrprobe.measure import loopback

    def loop(pair: RankPair, host: bool, ready: Callable[[], object]) -> LoopWindow:
        plan = plan_pair(pair, facts, gate)
        options = sized_for_budget(plan.options, seconds, 1, gate.keep_cq_moderation)
        windows: list[LoopWindow] = []

        def seen(result) -> None:
            windows.append(LoopWindow.ended_now(result, time.monotonic()))

        with nic_lock(plan.nic, 0.0, environ):
            loopback.runner(options, plan.endpoint, *gate.peer.address,
                            on_result=seen, on_ready=ready)(
                *((HOST, HOST) if host else (plan.local, plan.remote)))
        return windows[-1]

    return loop


def check_pair(pair: RankPair, facts: MachineFacts, gate: CheckPlan, budget: Budget,
               environ: Mapping[str, str]) -> CheckReport:
    """The A/B on one GPU and its NIC, its verdict with NCCL's decision, inside budget."""
    from gdrprobe.measure import loopback

    plan = plan_pair(pair, facts, gate)
    nic, use, local, remote, endpoint = plan.nic, plan.use, plan.local, plan.remote, plan.endpoint
    options = plan.options
    if budget.seconds is not None:
        options = sized_for_budget(options, budget.seconds,
                                   planned_runs(gate, remote.kind == local.kind == "gpu"),
                                   gate.keep_cq_moderation)
    criteria = gate.criteria
    floor = floor_check(nic, endpoint.port, facts, criteria.floor)
    wait_s = max(0.0, budget.remaining() - LOCK_RESERVE_S)
    watch = PortWatch(nic, endpoint.port, criteria.threshold, loopback=gate.peer.loopback)
    with nic_lock(nic, wait_s if math.isfinite(wait_s) else 3600.0, environ) as (held, why):
        def runner(capped):
            return loopback.runner(capped, endpoint, *gate.peer.address)

        run_once = watch.wrap(budgeted(runner, options, budget))
        here = holds_gpu_buffer(local, loopback=gate.peer.loopback)
        findings = facts.findings if here else ()
        try:
            report = ab_test(run_once, local, remote, staged=gate.staged,
                             repeats=criteria.repeats, threshold=criteria.threshold,
                             doctor_findings=findings,
                             min_repeats=min(2, criteria.repeats), floor=floor,
                             disturbed=lambda: bool(watch.foreign))
            verdict = disturbed(report.verdict, watch.foreign)
            write = dataclasses.replace(report, verdict=verdict)
            # Not watched for other traffic: the port's counters judge bandwidth runs of
            # WRITEs, and the extra answers only warn.
            extras = extra_answers(gate, write,
                                   lambda shape: budgeted(runner, shape(options), budget),
                                   local, remote, floor, findings, use, facts, nic)
        except GpuUnusable as error:
            elsewhere = held_elsewhere(error, pair.gpu, plan.sender, gate)
            if elsewhere is None:
                raise
            raise elsewhere from error
    placement = dataclasses.replace(
        pair, nic=nic, nic_reason=plan.nic_reason, time_budget_s=budget.seconds,
        elapsed_s=round(budget.elapsed(), 3), send_gpu=plan.sender,
        send_gpu_reason=plan.sender_why,
        lock=held.describe(why), port_traffic=watch.describe())
    verdict = nccl_pattern.join(
        secondary.with_warnings(with_nccl(verdict, use), extras.get("latency"),
                                extras.get("read"), extras.get("bidir")),
        extras.get("pattern"))
    if criteria.asks("gin"):
        extras["gin"] = gin_answer(pair.gpu, nic, facts, environ)
        verdict = dataclasses.replace(verdict, gin=extras["gin"], fix=verdict.fix or extras["gin"].fix)
    return dataclasses.replace(report, verdict=verdict, placement=placement, **extras)


# check --gin is not one of EXTRA_ANSWERS: it asks whatever the A/B's answer (the doorbell is
# not the A/B's question), and what it adds to the exit code is its own (report/check.py).
def gin_answer(gpu: str, nic: str, facts: MachineFacts, environ: Mapping[str, str]):
    """check --gin on the checked GPU and its NIC (:mod:`gdrprobe.campaign.gin`), with the
    doctor's modes for that GPU; the environment as NCCL sees it, and the process's NVSHMEM
    variables."""
    from gdrprobe.campaign.gin import gin_check

    bdf = facts.gpus.bus_id(gpu)
    return gin_check(gpu, nic, {**environ, **facts.nccl_environ}, nccl=facts.gin.get(bdf),
                     nvshmem=facts.ibgda.get(bdf))


def check_rank(gate: CheckPlan, gpu: str | None, environ: Mapping[str, str]) -> CheckReport:
    """check(): the budget, started first (it limits the whole call); the machine read once;
    the pair this process's rank will use (or the GPU and device given); the runs fitted to
    the locked-memory limit (loopback pins both ends here); the A/B on that pair. A check
    that could not start a single run answers "not testable" with its report."""
    budget = Budget(gate.time_budget_s)
    # NCCL's communicator on this node for the rank's own pair; a GPU given is checked
    # among every GPU of the node (whose communicator it is, nothing says).
    facts, gate = read_machine(gate, communicator(environ) if gpu is None else None)
    pair = counted_among(rank_pair(environ, facts.gpus, facts.nics, gpu, gate.endpoint.device),
                         facts, "a GPU given" if gpu is not None else
                         "nothing names the communicator's: no launcher's count, no job's GPUs")
    gate = dataclasses.replace(gate, options=memlock.fit_to_memlock(
        gate.options, gate.peer.ends_here, memlock.locked_memory()))
    try:
        return check_pair(pair, facts, gate, budget, environ)
    except NotTestable as error:
        return not_testable_check(error, pair, gate.criteria.threshold, budget)


def counted_among(pair: RankPair, facts: MachineFacts, unnamed: str) -> RankPair:
    """The pair with whose GPUs NCCL's choice of its NIC was counted: the communicator's on
    this node (campaign.communicator), else every GPU of the node (unnamed: why)."""
    if pair.nic is None or not pair.nic_reason.startswith(NCCL_CHOICE):
        return pair
    among = (facts.job.described if facts.job is not None and facts.job.bus_ids else
             f"every GPU of the node ({unnamed})")
    return dataclasses.replace(pair, nic_reason=f"{pair.nic_reason}; NCCL counts the "
                                                f"communicator's GPUs here: {among}")


def not_testable_check(error: GdrprobeError, pair: RankPair, threshold: float,
                       budget: Budget) -> CheckReport:
    """A check that could not start a single run (no RDMA device at all, the NIC another
    check held past the budget) answers as every other "not testable" does: the report,
    exit 9, not an exception (README's answers, docs/api.md); require() raises from it."""
    verdict = Verdict(NOT_TESTABLE, threshold=threshold, likely_causes=(error.cause,),
                      fix=error.fix, evidence=(error.evidence,) if error.evidence else ())
    placement = dataclasses.replace(pair, time_budget_s=budget.seconds,
                                    elapsed_s=round(budget.elapsed(), 3))
    return CheckReport(verdict, arms=(), settings=None, repeats=0, placement=placement)


def engaged(report: CheckReport) -> CheckReport:
    """require(): the report where GPUDirect RDMA is engaged (exit 0, or 13: a warning,
    never a reason to stop the job), else the error its exit code stands for, raised."""
    verdict = report.verdict
    if verdict.exit_code in (ExitCode.OK, ExitCode.PERFORMANCE_WARNING):
        return report
    error = {int(ExitCode.NOT_TESTABLE): NotTestable,
             int(ExitCode.NCCL_SETTING): NcclSetting,
             int(ExitCode.INCONCLUSIVE): Inconclusive}.get(verdict.exit_code, VerdictNotOk)
    ratio = f" (GPU/host {verdict.ratio:.2f})" if verdict.ratio is not None else ""
    cause = f": {main_cause(verdict)}" if verdict.likely_causes or verdict.inconclusive or verdict.gin else ""
    state = verdict.classification + (", inconclusive" if error is Inconclusive else "")
    raise error(f"GPUDirect RDMA is {state}{ratio}{cause}",
                verdict.fix, evidence="; ".join(verdict.evidence))
