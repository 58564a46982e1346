"""The microbenchmark sweep: message sizes x memory kinds x QP counts x GPU-NIC pairs.

Each (pair, memory kind, QP count) is one run over every size, so a sweep pays one set-up
per run, not per size; rows arrive size by size (the session's ``on_result``), so Ctrl-C
keeps every row measured until then. Host memory is measured once per NIC and QP count, the
reference for the GPU kinds on that NIC. A GPU kind has a GPU buffer on both ends: the NIC
reads GPU memory on one side and writes it on the other, as an NCCL transfer between two
nodes does. A kind that cannot run here (no CUDA driver, a NIC without DMA-BUF) fails the
same way at every size and QP count: it is tried once and becomes rows with its outcome.

Per pair, the verdict at the largest size comes from :func:`gdrprobe.campaign.verdict.classify`,
the A/B's own decision, each QP count counting as one repeat.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import socket
import time
from typing import Callable
from collections.abc import Iterable, Mapping, Sequence

from gdrprobe import defaults
from gdrprobe.errors import (GdrprobeError, Interrupted, NoDevice, RegistrationFailed,
                             UsageError)
from gdrprobe.campaign import machine, nccl_pattern
from gdrprobe.campaign.arguments import check_endpoint
from gdrprobe.campaign.ab import ARM_ERRORS, is_data_path_error
from gdrprobe.campaign.bench_plan import MEASURED, BenchPlan, Execute, PairPlan, RunPlan
from gdrprobe.campaign.bench_rails import bench_rails
from gdrprobe.campaign.gate import MachineFacts, NicChoice
from gdrprobe.campaign.nccl_use import receive_flush
from gdrprobe.measure.loops import bidir_result
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.nccl.pattern import NcclTransport, transport_settings
from gdrprobe.campaign.verdict import ArmMeasurement, check_threshold, classify
from gdrprobe.report.bench import read_baseline
from gdrprobe.report.model import (BaselineChange, BaselineComparison, BenchEnvironment,
                                   BenchPair, BenchReport, BenchRow, BenchSettings,
                                   LatencyResult)

BENCH_KINDS = ("host", "dmabuf", "peermem", "staged")


def bench_pairs(gpus: Sequence[str], nics: Sequence[str], decisions: Mapping[str, NicChoice],
                matrix: bool) -> tuple[PairPlan, ...]:
    """Every GPU with every NIC (matrix), or each GPU with the NIC NCCL gives it; a GPU with
    no known NIC (no PCI NIC in sysfs, the GPU's address unknown) pairs with every NIC."""
    if matrix:
        return tuple(PairPlan(gpu, nic, "--matrix: every GPU with every NIC")
                     for gpu in gpus for nic in nics)
    pairs = []
    for gpu in gpus:
        choice = decisions.get(gpu)
        if choice is None:
            pairs += [PairPlan(gpu, nic, f"no NCCL NIC decision for GPU {gpu}: every NIC")
                      for nic in nics]
        elif choice.nic in nics:
            pairs.append(PairPlan(gpu, choice.nic, choice.reason))
    return tuple(pairs)


# ---- rows ----------------------------------------------------------------------------


def measured_row(run: RunPlan, result, reverse=None, nccl=None, transport=None) -> BenchRow:
    """A size's row; reverse: in a bidirectional run, the other side's WRITEs of the same
    window (the sum is both directions'); nccl: NCCL's pattern after the stream, answered
    against it with the job's transport settings."""
    common = dict(mode=run.mode, gpu=run.gpu, nic=run.nic, memory=run.memory, qps=run.qps,
                  size_bytes=result.size_bytes, outcome=MEASURED, iterations=result.iterations,
                  elapsed_s=result.elapsed_s)
    if isinstance(result, LatencyResult):
        return BenchRow(**common, latency_us_min=result.latency_us_min,
                        latency_us_median=result.latency_us_median,
                        latency_us_mean=result.latency_us_mean,
                        latency_us_stdev=result.latency_us_stdev,
                        latency_us_p99=result.latency_us_p99,
                        latency_us_p999=result.latency_us_p999,
                        latency_us_max=result.latency_us_max)
    both = {}
    if reverse is not None:
        pair = bidir_result(result, reverse)
        both = dict(reverse_gbps=pair.server_to_client_gbps, bidir_sum_gbps=pair.sum_gbps)
    if nccl is not None:
        both = dict(nccl_gbps=nccl.rate_gbps, nccl_ceiling_gbps=nccl.ceiling_gbps,
                    nccl_step_us=nccl.alone.step_us, nccl_answer=nccl_pattern.answer(
                        result.bandwidth_avg_gbps, nccl, transport).outcome)
    return BenchRow(**common, bandwidth_avg_gbps=result.bandwidth_avg_gbps,
                    bandwidth_peak_gbps=result.bandwidth_peak_gbps,
                    message_rate_mpps=result.message_rate_mpps, **both)


def outcome_of(error: GdrprobeError) -> str:
    """The A/B's words for an arm that did not measure, and "failed" for any other error."""
    if isinstance(error, RegistrationFailed):
        return "registration failed"
    if is_data_path_error(error):
        return "data path broken"
    return "not testable" if isinstance(error, ARM_ERRORS) else "failed"


def failed_rows(run: RunPlan, sizes: Iterable[int], error: GdrprobeError) -> list[BenchRow]:
    return [BenchRow(mode=run.mode, gpu=run.gpu, nic=run.nic, memory=run.memory, qps=run.qps,
                     size_bytes=size, outcome=outcome_of(error), detail=error.cause,
                     fix=error.fix) for size in sizes]


def row_key(row) -> tuple:
    """What identifies a row across sweeps (a BenchRow or its JSON dict)."""
    get = row.get if isinstance(row, dict) else lambda name: getattr(row, name)
    return tuple(get(name) for name in ("mode", "gpu", "nic", "memory", "qps", "size_bytes"))


def host_bandwidths(rows: Sequence[BenchRow]) -> dict[tuple, float]:
    """The measured host-memory bandwidth by (NIC, QP count, size)."""
    return {(r.nic, r.qps, r.size_bytes): r.bandwidth_avg_gbps for r in rows
            if r.mode == "bandwidth" and r.memory == "host" and r.outcome == MEASURED}


def with_ratio(row: BenchRow, host: Mapping[tuple, float],
               line_rates: Mapping[str, float | None]) -> BenchRow:
    """A measured bandwidth row with its fraction of the port's line rate and, for GPU
    memory, its ratio to the host row of the same NIC, QP count and size (in host)."""
    if row.mode != "bandwidth" or row.outcome != MEASURED:
        return row
    rate = line_rates.get(row.nic)
    reference = host.get((row.nic, row.qps, row.size_bytes))
    return dataclasses.replace(
        row, line_rate_fraction=row.bandwidth_avg_gbps / rate if rate else None,
        gpu_host_ratio=(row.bandwidth_avg_gbps / reference
                        if row.memory != "host" and reference else None))


def with_ratios(rows: Sequence[BenchRow], line_rates: Mapping[str, float | None]) -> list[BenchRow]:
    host = host_bandwidths(rows)
    return [with_ratio(row, host, line_rates) for row in rows]


def ratios_as_measured(on_row: OnRow, line_rates: Mapping[str, float | None]) -> OnRow:
    """on_row seeing each row with its ratios already (the plan measures host memory before
    the GPU kinds, so a GPU row's host row is known when it arrives)."""
    host: dict[tuple, float] = {}

    def report(row: BenchRow, done: int, total: int) -> None:
        host.update(host_bandwidths([row]))
        on_row(with_ratio(row, host, line_rates), done, total)
    return report


# ---- per-pair verdicts ---------------------------------------------------------------


def arm_measurement(rows: Sequence[BenchRow], errors: Mapping[tuple, GdrprobeError],
                    memory: str, gpu: str, nic: str, size: int) -> ArmMeasurement:
    """One memory kind on a pair at one size, as the verdict reads an A/B arm: each QP
    count is one repeat."""
    common = dict(arm=memory, mechanism=None if memory == "host" else memory,
                  memory_kind="host" if memory == "host" else "device", message_bytes=size)
    error = errors.get((gpu, nic, memory))
    if isinstance(error, RegistrationFailed):
        return ArmMeasurement(registration_errno=error.error_code, **common)
    if is_data_path_error(error):
        return ArmMeasurement(data_path_error=error.cause, **common)
    if error is not None:
        return ArmMeasurement(not_testable=error.cause, fix=error.fix, **common)
    rates = tuple(r.bandwidth_avg_gbps for r in rows
                  if (r.mode, r.gpu, r.nic, r.memory, r.size_bytes, r.outcome)
                  == ("bandwidth", gpu, nic, memory, size, MEASURED))
    return ArmMeasurement(bandwidths_gbps=rates, **common)


def pair_verdicts(pairs: Sequence[PairPlan], rows: Sequence[BenchRow],
                  errors: Mapping[tuple, GdrprobeError], kinds: Sequence[str],
                  line_rates: Mapping[str, float | None], threshold: float,
                  findings=()) -> tuple[BenchPair, ...]:
    size = max((r.size_bytes for r in rows if r.mode == "bandwidth"), default=0)
    gpu_kinds = [kind for kind in kinds if kind != "host"]
    reports = []
    for pair in pairs:
        verdict = None
        if gpu_kinds and size:
            host = arm_measurement(rows, errors, "host", "", pair.nic, size)
            arms = [arm_measurement(rows, errors, kind, pair.gpu, pair.nic, size)
                    for kind in gpu_kinds]
            verdict = classify(host, arms, threshold, findings)
        reports.append(BenchPair(pair.gpu, pair.nic, pair.reason, line_rates.get(pair.nic),
                                 verdict))
    return tuple(reports)


# ---- running the sweep ---------------------------------------------------------------



@dataclasses.dataclass
class SweepResult:
    rows: list[BenchRow]
    errors: dict[tuple, GdrprobeError]   # (gpu, nic, memory) -> why that kind cannot run
    interrupted: bool
    measured_s: float


OnRow = Callable[[BenchRow, int, int], None]   # (row, rows so far, rows planned)


def run_sweep(plan: BenchPlan, execute: Execute,
              on_row: OnRow = lambda row, done, total: None) -> SweepResult:
    """Every run of the plan. execute(run, options, on_result) measures one run and calls
    on_result with each size's result; its errors become rows. Ctrl-C ends the sweep with
    the rows measured so far."""
    result = SweepResult([], {}, False, 0.0)
    total = plan.row_count()

    def keep(row: BenchRow) -> None:
        result.rows.append(row)
        on_row(row, len(result.rows), total)

    try:
        for run in plan.runs():
            options = plan.run_options(run)
            known = result.errors.get((run.gpu, run.nic, run.memory))
            if known is not None:
                for row in failed_rows(run, options.sizes, known):
                    keep(row)
                continue
            try:
                execute(run, options, lambda measured, reverse=None, nccl=None, run=run:
                        keep(measured_row(run, measured, reverse, nccl, plan.transport)))
            except Interrupted:
                raise            # a stopped loop: the sweep ends as at Ctrl-C
            except GdrprobeError as error:
                # A kind that cannot run here, or whose data path is broken, fails the same
                # at every QP count; any other failure is this run's answer and the next QP
                # count is still tried.
                if isinstance(error, ARM_ERRORS) or (
                        run.memory != "host" and is_data_path_error(error)):
                    result.errors[(run.gpu, run.nic, run.memory)] = error
                done = {row.size_bytes for row in result.rows if _same_run(row, run)}
                for row in failed_rows(run, [s for s in options.sizes if s not in done], error):
                    keep(row)
    except (KeyboardInterrupt, Interrupted):
        result.interrupted = True
    result.measured_s = sum(row.elapsed_s or 0.0 for row in result.rows)
    return result


def _same_run(row: BenchRow, run: RunPlan) -> bool:
    return (row.mode, row.gpu, row.nic, row.memory, row.qps) == (
        run.mode, run.gpu, run.nic, run.memory, run.qps)


# ---- comparison with an earlier sweep ----------------------------------------------------


def compare_rows(rows: Sequence[BenchRow], baseline_rows: Sequence[dict], source: str,
                 max_drop: float = defaults.MAX_DROP) -> BaselineComparison:
    """Flag each row that fell by more than max_drop against the baseline (bandwidth lower,
    median latency higher), or was measured then and is not now."""
    check_max_drop(max_drop)
    before = {row_key(row): row for row in baseline_rows}
    changes, compared = [], 0
    for row in rows:
        old = before.get(row_key(row))
        if old is None:
            continue
        compared += 1
        change = baseline_change(old, row, max_drop)
        if change is not None:
            changes.append(change)
    current = {row_key(row) for row in rows}
    return BaselineComparison(source=source, max_drop=max_drop, compared=compared,
                              not_in_this_run=sum(key not in current for key in before),
                              changes=tuple(changes))


def check_max_drop(max_drop: float) -> None:
    if not 0 < max_drop < 1:
        raise UsageError(f"maximum drop {max_drop:g}: use a fraction between 0 and 1",
                         "e.g. 0.1 flags a row that fell by more than 10%")


def baseline_change(old: dict, row: BenchRow, max_drop: float) -> BaselineChange | None:
    field = "bandwidth_avg_gbps" if row.mode == "bandwidth" else "latency_us_median"
    before = old.get(field)
    if old.get("outcome") != MEASURED or not isinstance(before, (int, float)) or before <= 0:
        return None
    if row.outcome != MEASURED:
        return BaselineChange(row, before, None, f"measured in the baseline, now {row.outcome}"
                                                 f": {row.detail}")
    change = getattr(row, field) / before - 1
    worse = -change if row.mode == "bandwidth" else change
    if worse <= max_drop:
        return None
    what = "bandwidth fell" if row.mode == "bandwidth" else "median latency rose"
    return BaselineChange(row, before, change,
                          f"{what} by {abs(change):.0%} (allowed {max_drop:.0%})")


# ---- what produced the numbers -------------------------------------------------------------


def bench_environment(cuda_facts: Mapping | None, nvidia_driver: str | None,
                      version: str) -> BenchEnvironment:
    """Host, kernel and every version a comparison between two sweeps needs. cuda_facts is
    :func:`gdrprobe.doctor.facts.cuda.gpu_inventory` (or ``{"error": ...}``); nvidia_driver the
    first line of /proc/driver/nvidia/version; version gdrprobe's (the caller's, above)."""
    from gdrprobe.rdma.verbs import rdma_core_version

    facts = cuda_facts or {}
    return BenchEnvironment(
        hostname=socket.gethostname(), kernel=platform.release(), gdrprobe_version=version,
        rdma_core_version=rdma_core_version(), cuda_python_version=distribution("cuda-python"),
        cuda_driver_version=facts.get("driver_version"), nvidia_driver_version=nvidia_driver,
        gpus=tuple(facts.get("gpus", ())))


def distribution(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- the whole sweep -------------------------------------------------------------------------


def run_bench(settings: BenchSettings, facts: MachineFacts, version: str, *,
              gpus: Sequence[str] = (), devices: Sequence[str] = (),
              gid_index: int | None = None, timeout_s: float = defaults.TIMEOUT_S,
              on_row: OnRow = lambda row, done, total: None) -> BenchReport:
    """Plan the sweep over this machine's GPUs (or `gpus`) and RDMA devices (or `devices`),
    run it in loopback and report. Ctrl-C ends it with the rows measured so far."""
    from gdrprobe.rdma.devices import list_devices

    started = time.monotonic()
    listed = {device.name: device for device in list_devices().devices}
    plan = bench_plan(settings, facts, gpus, select_nics(listed, devices), timeout_s, listed)
    line_rates = {name: port_rate(listed[name], settings.ib_port) for name in plan.nics()}
    execute = loopback_executor(settings.ib_port, gid_index)
    sweep = run_sweep(plan, execute, ratios_as_measured(on_row, line_rates))
    rows = with_ratios(sweep.rows, line_rates)
    rails = None
    if settings.all_rails and not sweep.interrupted:
        rails = bench_rails(plan, rows, facts, execute, settings.ib_port)
    return BenchReport(
        environment=bench_environment(facts.cuda_facts, facts.nvidia_driver, version),
        devices=tuple(listed[name] for name in plan.nics()), settings=settings,
        pairs=pair_verdicts(plan.pairs, rows, sweep.errors, settings.memory_kinds, line_rates,
                            settings.threshold, facts.findings),
        rows=tuple(rows), interrupted=sweep.interrupted, wall_s=time.monotonic() - started,
        measured_s=sweep.measured_s, rails=rails)


def bench(settings: BenchSettings, version: str, *, gpus: Sequence[str] = (),
          devices: Sequence[str] = (), gid_index: int | None = None,
          timeout_s: float = defaults.TIMEOUT_S, on_row: OnRow | None = None,
          baseline: str | None = None, max_drop: float = defaults.MAX_DROP) -> BenchReport:
    """bench(): the sweep on this machine's facts (one doctor), each row that fell by more
    than max_drop against an earlier sweep's JSON file (baseline: read before anything is
    measured) flagged. Every run's settings are refused first, before the machine is read
    or a device listed: a QP count, a time-out, a port or GID index out of range is the
    user's, never the node's (a device error would be taken for)."""
    check_endpoint(settings.ib_port, gid_index)
    check_sweep(settings, timeout_s)
    before = read_baseline(baseline) if baseline else None
    check_max_drop(max_drop)
    report = run_bench(settings, machine.machine_facts(), version, gpus=gpus, devices=devices,
                       gid_index=gid_index, timeout_s=timeout_s,
                       on_row=on_row or (lambda row, done, total: None))
    if before is None:
        return report
    return dataclasses.replace(report, baseline=compare_rows(report.rows, before, baseline,
                                                             max_drop))


def select_nics(listed: Mapping[str, object], devices: Sequence[str]) -> list[str]:
    unknown = [name for name in devices if name not in listed]
    if unknown:
        raise NoDevice(f"no RDMA device {', '.join(unknown)}",
                       f"this machine has {', '.join(listed)} ('gdrprobe devices')")
    return list(devices) or list(listed)


def sweep_options(settings: BenchSettings, timeout_s: float, relaxed_ordering: bool = True,
                  transport: NcclTransport | None = None) -> ProbeOptions:
    """The options every run of the sweep starts from (BenchPlan.run_options varies them):
    with --pattern nccl and no sizes given, NCCL's step sizes (transport: the job's settings;
    None: NCCL's defaults)."""
    sizes = settings.sizes_bytes or nccl_pattern.pattern_sizes(transport or NcclTransport())
    return ProbeOptions(sizes=sizes, iterations=settings.iterations,
                        duration_s=settings.duration_s, warmup_s=settings.warmup_s,
                        tx_depth=settings.tx_depth, cq_moderation=settings.cq_moderation,
                        timeout_s=timeout_s, opcode=settings.opcode, bidir=settings.bidir,
                        relaxed_ordering=relaxed_ordering)


def check_sweep(settings: BenchSettings, timeout_s: float) -> None:
    """Every run a sweep of these settings makes, its options refused (UsageError) as the
    plan would refuse them, but before the machine is read: one stand-in pair per NIC."""
    check_threshold(settings.threshold)
    unknown = [kind for kind in settings.memory_kinds if kind not in BENCH_KINDS]
    if unknown or not settings.memory_kinds:
        raise UsageError(f"memory kinds {', '.join(unknown) or '(none)'}: use "
                         f"{', '.join(BENCH_KINDS)}", "e.g. --mem host,dmabuf")
    if not settings.qps:
        raise UsageError("no QP count to run", "e.g. -q 1,4")
    plan = BenchPlan((PairPlan("0", "any NIC", ""),), settings.memory_kinds, settings.qps,
                     sweep_options(settings, timeout_s), settings.latency_iterations)
    for run in plan.runs():
        plan.run_options(run)


def bench_plan(settings: BenchSettings, facts: MachineFacts, gpus: Sequence[str],
               nics: Sequence[str], timeout_s: float, listed=None) -> BenchPlan:
    """The runs of a sweep, every one's options checked before the first run starts;
    listed: the devices by name (their ports: NCCL's connections for --pattern nccl)."""
    check_sweep(settings, timeout_s)
    if settings.memory_kinds == ("host",):
        pairs = tuple(PairPlan("", nic, "host memory only") for nic in nics)
    else:
        # With no GPU known (no CUDA driver, none in sysfs) CUDA ordinal 0 still runs the
        # GPU kinds, so their rows say why they cannot run here.
        gpu_list = (tuple(facts.gpus.bus_id(gpu) for gpu in gpus)
                    or facts.gpus.runtime_bus_ids or facts.gpus.sysfs_bus_ids or ("0",))
        pairs = bench_pairs(gpu_list, nics, facts.nics, settings.matrix)
    if not pairs:
        raise UsageError(f"NCCL pairs no GPU with {', '.join(nics)}",
                         "add --matrix to pair every GPU with every NIC")
    # Registered as NCCL registers (NCCL_IB_PCI_RELAXED_ORDERING, as check and run read it).
    transport = transport_settings(facts.nccl_environ) if settings.pattern else None
    options = sweep_options(settings, timeout_s,
                            facts.nccl_rules.relaxed_ordering(facts.nccl_environ), transport)
    flushes = {pair.gpu: receive_flush(facts.nccl.get(pair.gpu)) for pair in pairs if pair.gpu}
    shapes = {nic: nccl_pattern.pattern_shape(transport, *nccl_pattern.port_of(
        (listed or {}).get(nic), settings.ib_port)) for nic in nics} if transport else {}
    plan = BenchPlan(pairs, settings.memory_kinds, settings.qps, options,
                     settings.latency_iterations, flushes, shapes, transport)
    for run in plan.runs():
        plan.run_options(run)   # raises UsageError now rather than mid-sweep
    return plan


def port_rate(device, port: int) -> float | None:
    """The port's rate (speed x width) from the device listing."""
    listed = device.port_info(port)
    return listed.rate_gbps if listed is not None else None


def loopback_executor(ib_port: int, gid_index: int | None) -> Execute:
    """Execute for :func:`run_sweep`: each run in loopback on its NIC, the memory kind on
    both ends."""
    from gdrprobe.measure.loopback import runner
    from gdrprobe.memory.spec import MemorySpec
    from gdrprobe.rdma.endpoint import EndpointOptions

    def execute(run: RunPlan, options: ProbeOptions, on_result, on_ready=None) -> None:
        memory = MemorySpec.from_choice(run.memory, gpu=run.gpu or "0")
        endpoint = EndpointOptions(device=run.nic, port=ib_port, gid_index=gid_index)
        runner(options, endpoint, on_result=on_result, on_ready=on_ready)(memory, memory)

    return execute
