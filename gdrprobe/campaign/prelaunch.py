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
  immediate, host memory at both ends against the check's GPU memory), the A/B with RDMA
  READ and the A/B with both ends WRITEing at once
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
import statistics
import time
from typing import Callable
from collections.abc import Mapping

from gdrprobe import defaults
from gdrprobe.campaign.ab import ARM_ERRORS, HOST, StopSampling, ab_test, no_device_not_testable
from gdrprobe.campaign.gate import Budget, MachineFacts, budgeted, sized_for_budget
from gdrprobe.campaign.latency_ab import latency_ab
from gdrprobe.campaign import secondary
from gdrprobe.campaign.machine import holds_gpu_buffer, nccl_use_of
from gdrprobe.campaign.nccl_use import as_nccl_registers, receive_flush
from gdrprobe.campaign.nic_lock import nic_lock
from gdrprobe.campaign.port_traffic import PortWatch
from gdrprobe.campaign.verdict import disturbed, with_nccl
from gdrprobe.errors import GpuUnusable, Inconclusive, NoRdmaDevice, UsageError
from gdrprobe.measure.options import MIN_TIMEOUT_S, ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.nccl.env import int_param
from gdrprobe.rdma.endpoint import EndpointOptions
from gdrprobe.rdma.verbs import GidPreference
from gdrprobe.report.check import CheckReport, FloorCheck, LoopWindow, NcclUse, RankPair
from gdrprobe.sysroot import PCI_BUS_ID

MIN_BIDIR_WINDOW_S = 0.1   # a window for the bidirectional runs where the check set none

# What a check keeps of its budget for the runs when it waits for a NIC another check
# holds: the first run may start only with the shortest out-of-band time-out left, the
# second likewise (gate.budgeted).
LOCK_RESERVE_S = 2 * MIN_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class GateSettings:
    """What a check is asked, the same for every GPU of a node check."""

    options: ProbeOptions                      # the runs', before sizing to the budget
    gpu_memory: Callable[[str], MemorySpec]    # a GPU (bus id or ordinal) -> the send buffer
    receive_memory: Callable[[str], MemorySpec]   # a GPU -> the receive buffer (a server's)
    ib_port: int = 1
    gid_index: int | None = None
    repeats: int = defaults.REPEATS
    threshold: float = defaults.THRESHOLD
    floor: float = defaults.FLOOR
    staged: bool = False
    keep_cq_moderation: bool = False           # asked for: not perftest's rule
    host: str | None = None                    # a server instead of loopback
    port: int = defaults.PORT
    token: str | None = None
    # The GPUs (bus ids) that another process holding is a fault of: in a node check, the
    # job's, which no process of the job holds yet; None in a rank's check (the job runs,
    # and its other ranks may hold theirs): the checked GPU alone.
    job_gpus: tuple[str, ...] | None = None
    # The extra answers on an engaged node (campaign/secondary.py): the latency A/B with its
    # bound on the GPU/host median ratio, and the A/B with RDMA READ.
    latency: bool = False
    latency_factor: float = defaults.LATENCY_FACTOR
    latency_factor_source: str = secondary.DEFAULT_FACTOR_SOURCE
    read: bool = False
    bidir: bool = False      # the A/B with both ends WRITEing at once (perftest's -b)


def check_floor(floor: float) -> None:
    if not 0 <= floor <= 1:
        raise UsageError(f"--floor {floor:g}: use a fraction of line rate from 0 to 1",
                         f"e.g. {defaults.FLOOR:g}; 0 turns the floor off")


def floor_check(nic: str, port: int, facts: MachineFacts, floor: float) -> FloorCheck:
    """The port's line rate and whether the floor applies to it (floor: checked by the
    API before the doctor ran, check_floor)."""
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
    """NCCL_IB_GID_INDEX on a RoCE port, as NCCL takes it (connect.cc ncclIbGetGidIndex:
    a value >= 0 is used as is; -1, its default, chooses); None: gdrprobe chooses (a RoCE v2
    IPv4 GID, NCCL's default version and address family)."""
    stated = facts.ports.get((nic, port))
    if stated is None or stated.link_layer != "Ethernet":
        return None
    value = int_param(facts.nccl_environ, "NCCL_IB_GID_INDEX", -1)
    return value if value >= 0 else None


def nccl_gid_preference(environ: Mapping[str, str]) -> GidPreference:
    """What NCCL's walk of a RoCE port's GID table asks for, from the job's environment
    (NCCL 2.30.7 src/transport/net_ib/connect.cc): envIbAddrFamily (AF_INET unless the
    variable is exactly "AF_INET6"), NCCL_PARAM IbRoceVersionNum (2), envIbAddrRange (the
    text; GidPreference.network reads it as NCCL does)."""
    return GidPreference(
        family=6 if environ.get("NCCL_IB_ADDR_FAMILY") == "AF_INET6" else 4,
        roce_version=int_param(environ, "NCCL_IB_ROCE_VERSION_NUM", 2),
        address_range=environ.get("NCCL_IB_ADDR_RANGE") or None)


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


def as_nccl_exports(memory: MemorySpec, use: NcclUse | None) -> MemorySpec:
    """A GPU buffer registered and exported as NCCL will: through NCCL's mechanism where
    --mem gpu leaves it open (nccl_use.as_nccl_registers), with the PCIe mapping type where
    NCCL asks for it (a C2C system's GPU on a PCIe path to its NIC)."""
    memory = as_nccl_registers(memory, use)
    if memory.kind != "gpu" or use is None or not use.pcie_mapping:
        return memory
    return dataclasses.replace(memory, pcie_mapping=True)


def planned_runs(gate: GateSettings, two_ended: bool) -> int:
    """The most runs the A/B can make: the host arm and each deciding arm per repeat, and
    with GPU memory at both ends the two one-direction arms' repeats; the extra answers'
    two arms per repeat each."""
    extras = 2 * gate.repeats * (gate.latency + gate.read + gate.bidir)
    return gate.repeats * (2 + gate.staged) + (3 * gate.repeats if two_ended else 0) + extras


def latency_options(options: ProbeOptions) -> ProbeOptions:
    """The latency A/B's runs: a ping-pong of WRITEs with immediate at small sizes, one QP,
    a fixed count (perftest's ib_write_lat --write_with_imm), no flush (a READ of its own)."""
    return dataclasses.replace(options, mode="latency", opcode="write_imm",
                               sizes=defaults.CHECK_LATENCY_SIZES,
                               iterations=defaults.CHECK_LATENCY_ITERATIONS, duration_s=None,
                               window_bytes=None, qps=1, tx_depth=1, cq_moderation=1,
                               post_list=1, flush="")


def read_options(options: ProbeOptions) -> ProbeOptions:
    """The READ A/B's runs: the check's, the client's NIC reading the server's buffer (a
    READ run has no flush: that follows a WRITE)."""
    return dataclasses.replace(options, opcode="read", flush="")


def bidir_options(options: ProbeOptions, host_gbps: float) -> ProbeOptions:
    """The bidirectional A/B's runs: the check's, both sides WRITEing at once for a number
    of iterations (a bidirectional run checks every message, so it has no duration): as
    many as the WRITE A/B's host arm moved per QP in one of its windows, at least 10."""
    size, window_s = max(options.sizes), options.duration_s or MIN_BIDIR_WINDOW_S
    iterations = int(host_gbps * 1e9 / 8 * window_s / size / options.qps)
    return dataclasses.replace(options, bidir=True, flush="", duration_s=None,
                               window_bytes=None, iterations=max(10, iterations))


def latency_answer(gate: GateSettings, runner, local: MemorySpec, remote: MemorySpec):
    """check --latency: the latency A/B and its answer; not run where the budget or the
    GPU arm cannot hold it (a corrupt payload stays the run's error)."""
    try:
        report = latency_ab(runner, local, remote, gate.repeats)
    except (StopSampling, *ARM_ERRORS) as error:
        return secondary.latency_not_run(gate.latency_factor, gate.latency_factor_source,
                                         f"the latency runs stopped: {error}")
    return secondary.latency_check(report, gate.latency_factor, gate.latency_factor_source)


def read_answer(gate: GateSettings, runner, local: MemorySpec, remote: MemorySpec,
                floor: FloorCheck, findings, what: str, opcode: str = "write"):
    """check --read, --bidir: the A/B again with RDMA READ, or both ends WRITEing at once,
    as the WRITE A/B ran, and its answer."""
    try:
        report = ab_test(runner, local, remote, repeats=gate.repeats,
                         threshold=gate.threshold, doctor_findings=findings,
                         min_repeats=min(2, gate.repeats), floor=floor, opcode=opcode)
    except StopSampling as stop:
        return secondary.read_not_run(f"the {what} runs stopped: {stop}")
    return secondary.read_check(report, what)


def extra_answers(gate: GateSettings, write: CheckReport, runner_for, local: MemorySpec,
                  remote: MemorySpec, floor: FloorCheck, findings) -> dict:
    """The extra answers asked for, as CheckReport fields: measured where the WRITE A/B is
    a conclusive "engaged" (write: its report, verdict as disturbed() left it), else each
    says why not."""
    blocked = secondary.blocked_by(write.verdict)
    answers = {}
    if gate.latency:
        answers["latency"] = (
            secondary.latency_not_run(gate.latency_factor, gate.latency_factor_source,
                                      blocked) if blocked else
            latency_answer(gate, runner_for(latency_options), local, remote))
    if gate.read:
        answers["read"] = (secondary.read_not_run(blocked) if blocked else
                           read_answer(gate, runner_for(read_options), local, remote, floor,
                                       findings, secondary.READ_WHAT, opcode="read"))
    if gate.bidir:
        host_gbps = statistics.median(next((arm.bandwidths_gbps for arm in write.arms
                                            if arm.arm == "host" and arm.bandwidths_gbps), (0.0,)))
        answers["bidir"] = (secondary.read_not_run(blocked) if blocked else
                            read_answer(gate, runner_for(lambda options: bidir_options(
                                options, host_gbps)), local, remote, floor, findings,
                                secondary.BIDIR_WHAT))
    return answers


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
                   gate: GateSettings) -> Inconclusive | None:
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


def plan_pair(pair: RankPair, facts: MachineFacts, gate: GateSettings) -> PairPlan:
    """The NIC, memory and options of a GPU's runs, as NCCL will move its bytes."""
    use = nccl_use_of(facts, pair.gpu)
    nic = pair.nic or first_rdma_device()
    sender, sender_why = send_gpu(pair, use, facts.gpus.runtime_bus_ids)
    local = as_nccl_exports(gate.gpu_memory(sender) if sender is not None else HOST, use)
    remote = as_nccl_exports(gate.receive_memory(pair.gpu), use)
    gid_index, nic_reason = gate.gid_index, pair.nic_reason
    nccl_gid = nccl_gid_index(facts, nic, gate.ib_port)
    if gid_index is None and nccl_gid is not None:
        gid_index = nccl_gid
        nic_reason += f"; GID index {gid_index} from NCCL_IB_GID_INDEX"
    endpoint = EndpointOptions(device=nic, port=gate.ib_port, gid_index=gid_index,
                               gid_preference=nccl_gid_preference(facts.nccl_environ))
    options = dataclasses.replace(gate.options, flush=receive_flush(use))
    return PairPlan(nic, nic_reason, sender, sender_why, local, remote, endpoint, options, use)


def rail_loop(facts: MachineFacts, gate: GateSettings, seconds: float,
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
            loopback.runner(options, plan.endpoint, gate.host, gate.port, gate.token,
                            on_result=seen, on_ready=ready)(
                *((HOST, HOST) if host else (plan.local, plan.remote)))
        return windows[-1]

    return loop


def check_pair(pair: RankPair, facts: MachineFacts, gate: GateSettings, budget: Budget,
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
    floor = floor_check(nic, gate.ib_port, facts, gate.floor)
    wait_s = max(0.0, budget.remaining() - LOCK_RESERVE_S)
    watch = PortWatch(nic, gate.ib_port, gate.threshold, loopback=gate.host is None)
    with nic_lock(nic, wait_s if math.isfinite(wait_s) else 3600.0, environ) as (held, why):
        def runner(capped):
            return loopback.runner(capped, endpoint, gate.host, gate.port, gate.token)

        run_once = watch.wrap(budgeted(runner, options, budget))
        here = holds_gpu_buffer(local, loopback=gate.host is None)
        findings = facts.findings if here else ()
        try:
            report = ab_test(run_once, local, remote, staged=gate.staged,
                             repeats=gate.repeats, threshold=gate.threshold,
                             doctor_findings=findings,
                             min_repeats=min(2, gate.repeats), floor=floor,
                             disturbed=lambda: bool(watch.foreign))
            verdict = disturbed(report.verdict, watch.foreign)
            write = dataclasses.replace(report, verdict=verdict)
            # Not watched for other traffic: the port's counters judge bandwidth runs of
            # WRITEs, and the extra answers only warn.
            extras = extra_answers(gate, write,
                                   lambda shape: budgeted(runner, shape(options), budget),
                                   local, remote, floor, findings)
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
    verdict = secondary.with_warnings(with_nccl(verdict, use), extras.get("latency"),
                                      extras.get("read"), extras.get("bidir"))
    return dataclasses.replace(report, verdict=verdict, placement=placement, **extras)
