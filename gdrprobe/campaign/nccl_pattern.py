"""The NCCL-pattern arm's answers (``--pattern nccl``): whether the path sustains NCCL's own
traffic pattern, or whether the round trip of a step caps what NCCL can move per connection,
and what would raise that cap in NCCL's own parameters; in the A/B, whether the GPU arm keeps
the host arm's pattern, and which phase of a step it loses time in.

The arithmetic, from NCCL's transport (gdrprobe.nccl.pattern): a connection keeps NCCL_STEPS
steps in flight, and a step's slot comes back only once the step is consumed, so a connection
moves at most NCCL_STEPS x step bytes per step time (a step alone, from its clear-to-send to
its consumption), and never more than the path streams: predicted = min(stream, channels x
NCCL_STEPS x size / step time). Pure, but for :func:`port_facts` (which asks verbs).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from gdrprobe import defaults
from gdrprobe.campaign.arguments import check_pattern_name
from gdrprobe.measure.nccl_shape import NcclShape
from gdrprobe.nccl import params
from gdrprobe.nccl.pattern import COLLECTIVE, STEPS, NcclTransport
from gdrprobe.report.check import DEGRADED, ENGAGED, INCONCLUSIVE, NOT_RUN, Verdict
from gdrprobe.report.model import RunReport
from gdrprobe.report.nccl_pattern import (BELOW_PREDICTION, PHASES, ROUND_TRIP_BOUND, SUSTAINS,
                                          NcclAnswer, NcclPatternCheck, NcclPatternRatio,
                                          NcclPatternResult, StepPhases)

WITHIN = "within"
MIN_WINDOW_S = 0.1   # check --pattern: a window for the pattern's runs where the check set none
QPS_NOTE = ("NCCL_IB_QPS_PER_CONNECTION does not: a connection keeps NCCL_STEPS steps in "
            "flight however many QPs carry them (it helps where one QP's own rate limits the "
            "data phase, with NCCL_IB_SPLIT_DATA_ON_QPS=1)")
# What each phase of a step says when the GPU arm spends more time in it than the host arm.
PHASE_CAUSES = {
    "flush": ("NCCL's flush (an RDMA READ of the received GPU buffer, after every GPUDirect "
              "receive) is slow on this path: the NIC's reads of GPU memory"),
    "data": ("a step's data takes longer into or out of GPU memory: the NIC's writes to the "
             "receive buffer or reads of the send buffer, per message"),
    "clear-to-send": ("the receiver takes longer to turn a step around: its completions on "
                      "GPU memory, before the next clear-to-send"),
}
PHASE_FIXES = {
    "flush": ("check the path between NIC and GPU for reads ('gdrprobe doctor': ACS, IOMMU, "
              "the PCIe switch); NCCL_GDR_FLUSH_DISABLE=1 removes the flush only where the GPU "
              "does not need it (NCCL's rule: gdrprobe.nccl.flush)"),
    "data": "check the path between NIC and GPU ('gdrprobe doctor': ACS, IOMMU, PCIe link)",
    "clear-to-send": "check the path between NIC and GPU ('gdrprobe doctor')",
}


def port_facts(device: str | None, port: int) -> tuple[bool, float | None]:
    """(an InfiniBand port, its line rate in Gb/s) of the device a run uses: what NCCL's
    adaptive routing and its channel count follow."""
    from gdrprobe.rdma.devices import list_devices

    found = list_devices(device).devices
    return port_of(found[0] if found else None, port)


def port_of(device, port: int) -> tuple[bool, float | None]:
    """(an InfiniBand port, its rate) of a listed device (a DeviceInfo; None: unknown)."""
    listed = device.port_info(port) if device is not None else None
    if listed is None:
        return False, None
    return listed.link_layer == "InfiniBand", listed.rate_gbps


def pattern_shape(transport: NcclTransport, infiniband: bool, gbps: float | None) -> NcclShape:
    """The connections NCCL opens to one peer, as the job's settings shape them."""
    return NcclShape(channels=transport.channels(gbps),
                     qps_per_connection=transport.qps_per_connection,
                     split=transport.split_data_on_qps,
                     adaptive_routing=transport.adaptive_routing_on(infiniband),
                     ar_threshold=transport.ar_threshold, inline_cts=transport.use_inline)


def pattern_sizes(transport: NcclTransport) -> tuple[int, ...]:
    """NCCL's step sizes: the point-to-point chunk and the collective's step."""
    return tuple(sorted({size for _, size in transport.step_sizes()}))


def shape_of(size: int, transport: NcclTransport) -> str:
    names = [name for name, step in transport.step_sizes() if step == size]
    return "/".join(names)


def _gbps(value: float) -> str:
    return f"{value:.3f} Gb/s" if value < 10 else f"{value:.1f} Gb/s"


def answer(stream_gbps: float, result: NcclPatternResult, transport: NcclTransport,
           threshold: float = defaults.THRESHOLD) -> NcclAnswer:
    """One size's answer against the stream of the same size on the same connection."""
    ceiling, channels = result.ceiling_gbps, result.channels
    predicted = min(stream_gbps, channels * ceiling)
    shape = shape_of(result.size_bytes, transport)
    settings = settings_named(result, transport, shape)
    common = dict(size_bytes=result.size_bytes, shape=shape, stream_gbps=stream_gbps,
                  pattern_gbps=result.rate_gbps, channels=channels, ceiling_gbps=ceiling,
                  predicted_gbps=predicted, settings=settings)
    alone = result.alone
    bytes_us = result.size_bytes * 8 / (stream_gbps * 1e3) if stream_gbps > 0 else 0.0
    step = (f"a {result.size_bytes} B step alone takes {alone.step_us:.1f} us from its "
            f"clear-to-send to its consumption (clear-to-send {alone.cts_us:.1f}, data "
            f"{alone.data_us:.1f}: {min(bytes_us, alone.data_us):.1f} its bytes at the "
            f"stream's rate and the rest the round trip, flush {alone.flush_us:.1f})")
    if stream_gbps > 0 and result.rate_gbps >= threshold * stream_gbps:
        return NcclAnswer(outcome=SUSTAINS, text=(
            f"the path sustains NCCL's pattern: {_gbps(result.rate_gbps)} against the "
            f"stream's {_gbps(stream_gbps)} ({result.rate_gbps / stream_gbps:.2f}); {step}, "
            f"a ceiling of {_gbps(channels * ceiling)}: a gap in the job lies inside NCCL "
            "(its proxy thread, its GPU kernels, the LL/LL128 protocols) or in its settings"),
            **common)
    if channels * ceiling < threshold * stream_gbps:
        return NcclAnswer(outcome=ROUND_TRIP_BOUND, text=(
            f"round-trip bound: NCCL cannot exceed {_gbps(ceiling)} per connection here "
            f"({channels} channel(s): {_gbps(channels * ceiling)}, against the stream's "
            f"{_gbps(stream_gbps)}): {step}, and NCCL keeps {STEPS} steps in flight per "
            f"connection (NCCL_STEPS); measured {_gbps(result.rate_gbps)}, "
            f"{result.rate_gbps / predicted:.2f} of the prediction"),
            raise_by=raise_by(result, stream_gbps, shape, threshold), **common)
    return NcclAnswer(outcome=BELOW_PREDICTION, text=(
        f"NCCL's pattern reached {_gbps(result.rate_gbps)}, under the stream's "
        f"{_gbps(stream_gbps)} and its own prediction {_gbps(predicted)}: with steps in "
        f"flight a step took {result.loaded.step_us:.1f} us, {result.loaded.cts_us:.1f} of "
        f"them the sender waiting for its clear-to-send ({step})"), **common)


def raise_by(result: NcclPatternResult, stream_gbps: float, shape: str,
             threshold: float) -> tuple[str, ...]:
    """NCCL's parameters that would lift the ceiling to threshold x the stream: channels (each
    a connection with NCCL_STEPS steps of its own) or larger steps (the round trip paid once
    for more bytes; a step's bytes take longer at the stream's rate)."""
    target = threshold * stream_gbps
    channels = 1 << max(0, math.ceil(target / result.ceiling_gbps) - 1).bit_length() \
        if result.ceiling_gbps > 0 else result.channels
    lines = []
    channel_variable = params.MIN_NCHANNELS.name if shape == COLLECTIVE else params.NCHANNELS_PER_NET_PEER.name
    if channels > result.channels:
        lines.append(f"{channel_variable}={channels} (now {result.channels}): each channel is "
                     f"a connection with its own {STEPS} steps in flight")
    size = larger_step(result, stream_gbps, target / result.channels)
    if size:
        variable = (params.BUFFSIZE.name, size * STEPS) if shape == COLLECTIVE else \
            (params.P2P_NET_CHUNKSIZE.name, size)
        lines.append(f"{variable[0]}={variable[1]} (a step of {size} B, now "
                     f"{result.size_bytes} B): the round trip paid once for more bytes")
    return (*lines, QPS_NOTE)


def larger_step(result: NcclPatternResult, stream_gbps: float, per_connection_gbps: float) -> int:
    """The smallest power-of-two step whose ceiling (the step alone growing by its extra bytes
    at the stream's rate) reaches per_connection_gbps; 0 where none can."""
    rate = stream_gbps * 1e3 / 8                       # bytes per microsecond
    target = per_connection_gbps * 1e3 / 8
    fixed = result.alone.step_us - result.size_bytes / rate
    if rate <= 0 or target >= STEPS * rate:
        return 0
    needed = target * max(fixed, 0.0) / (STEPS - target / rate)
    size = max(result.size_bytes * 2, 1 << max(0, math.ceil(needed) - 1).bit_length())
    return size if size <= 1 << 30 else 0


def settings_named(result: NcclPatternResult, transport: NcclTransport,
                   shape: str) -> tuple[str, ...]:
    """The settings that shaped the steps, each with its value and whether it was set."""
    steps = (transport.variable(params.BUFFSIZE.name, transport.buffsize) if shape == COLLECTIVE
             else transport.variable(params.P2P_NET_CHUNKSIZE.name, transport.p2p_chunk))
    channels = (transport.variable(params.NCHANNELS_PER_NET_PEER.name, result.channels)
                if transport.channels_per_net_peer else
                f"{result.channels} channel(s) (NCCL's rule for the NIC's speed)")
    named = [steps, channels,
             transport.variable(params.IB_QPS_PER_CONNECTION.name, transport.qps_per_connection),
             transport.variable(params.IB_SPLIT_DATA_ON_QPS.name, int(transport.split_data_on_qps))]
    if result.adaptive_routing or params.IB_ADAPTIVE_ROUTING.name in transport.set:
        named.append(f"adaptive routing {'on' if result.adaptive_routing else 'off'} "
                     f"(NCCL_IB_AR_THRESHOLD={transport.ar_threshold})")
    return tuple(named)


def answers(run: RunReport, transport: NcclTransport,
            threshold: float = defaults.THRESHOLD) -> tuple[NcclAnswer, ...]:
    """Each size's answer, against that size's stream in the same run."""
    streams = {row.size_bytes: row.bandwidth_avg_gbps for row in run.bandwidth}
    return tuple(answer(streams.get(result.size_bytes, 0.0), result, transport, threshold)
                 for result in run.nccl)


def answered(run: RunReport, transport: NcclTransport | None,
             threshold: float = defaults.THRESHOLD) -> RunReport:
    """The run with its NCCL-pattern answers (as it is without a pattern)."""
    if transport is None:
        return run
    return dataclasses.replace(run, nccl_answers=answers(run, transport, threshold))


# ---- the A/B -------------------------------------------------------------------------------

def _median_phases(phases: list[StepPhases]) -> StepPhases:
    return StepPhases(*(statistics.median(getattr(p, name) for p in phases)
                        for name in ("step_us", "cts_us", "data_us", "flush_us")))


def _ratio(size: int, host_runs, gpu_runs) -> NcclPatternRatio | None:
    host = [r for run in host_runs for r in run.nccl if r.size_bytes == size]
    gpu = [r for run in gpu_runs for r in run.nccl if r.size_bytes == size]
    if not host or not gpu:
        return None
    ratios = tuple(g.rate_gbps / h.rate_gbps for h, g in zip(host, gpu) if h.rate_gbps > 0)
    host_alone, gpu_alone = (_median_phases([r.alone for r in rows]) for rows in (host, gpu))
    phase = max(PHASES, key=lambda name: gpu_alone.phase(name) - host_alone.phase(name))
    return NcclPatternRatio(
        size_bytes=size, host_gbps=statistics.median(r.rate_gbps for r in host),
        gpu_gbps=statistics.median(r.rate_gbps for r in gpu),
        ratio=statistics.median(ratios) if ratios else 0.0, ratios=ratios,
        host_alone=host_alone, gpu_alone=gpu_alone, phase=phase)


def pattern_check(host_runs, gpu_runs, transport: NcclTransport,
                  threshold: float = defaults.THRESHOLD) -> NcclPatternCheck:
    """The GPU arm's NCCL pattern against the host arm's, size by size, repeat by repeat:
    degraded where every repeat's ratio is under the threshold, inconclusive where they
    straddle it, within otherwise."""
    if not host_runs or not gpu_runs:
        return NcclPatternCheck(NOT_RUN, "the GPU arm measured no NCCL pattern")
    sizes = sorted({r.size_bytes for run in host_runs for r in run.nccl})
    ratios = tuple(found for size in sizes if (found := _ratio(size, host_runs, gpu_runs)))
    short = [r for r in ratios if r.ratios and max(r.ratios) < threshold]
    straddle = [r for r in ratios if r.ratios and min(r.ratios) < threshold <= max(r.ratios)]
    host, gpu = (answers(runs[-1], transport, threshold) for runs in (host_runs, gpu_runs))
    if short:
        worst = min(short, key=lambda r: r.ratio)
        detail = (f"at {worst.size_bytes} B steps the GPU arm's NCCL pattern reaches "
                  f"{worst.ratio:.2f} of the host arm's ({_gbps(worst.gpu_gbps)} against "
                  f"{_gbps(worst.host_gbps)}); a step alone spends more in its {worst.phase} "
                  f"phase: {worst.gpu_alone.phase(worst.phase):.1f} us against "
                  f"{worst.host_alone.phase(worst.phase):.1f} us")
        return NcclPatternCheck(DEGRADED, detail, ratios, host, gpu)
    if straddle:
        return NcclPatternCheck(INCONCLUSIVE, "the repeats' ratios of the GPU arm's NCCL "
                                "pattern to the host arm's straddle the threshold", ratios,
                                host, gpu)
    return NcclPatternCheck(WITHIN, "", ratios, host, gpu)


def join(verdict: Verdict, check: NcclPatternCheck | None) -> Verdict:
    """The verdict with NCCL's pattern where it decides: a GPU arm that streams as the host
    arm does (engaged) but whose NCCL pattern falls below the host arm's is degraded, the
    phase named; one whose ratios straddle the threshold leaves the answer inconclusive."""
    if check is None or verdict.classification != ENGAGED:
        return verdict
    if check.outcome == DEGRADED:
        worst = min((r for r in check.ratios if r.ratios and max(r.ratios) < verdict.threshold),
                    key=lambda r: r.ratio)
        return dataclasses.replace(
            verdict, classification=DEGRADED,
            likely_causes=(f"NCCL's pattern: {check.detail}", PHASE_CAUSES[worst.phase],
                           *verdict.likely_causes),
            evidence=(*verdict.evidence, f"NCCL pattern ratios at {worst.size_bytes} B: "
                      + ", ".join(f"{r:.2f}" for r in worst.ratios)),
            fix=PHASE_FIXES[worst.phase])
    if check.outcome == INCONCLUSIVE:
        return dataclasses.replace(verdict, inconclusive=True,
                                   evidence=(*verdict.evidence, f"NCCL pattern: {check.detail}"))
    return verdict


# ---- what a run, check or bench asks for ------------------------------------------------

def check_pattern(pattern: str | None, settings: dict) -> None:
    """--pattern as given, with the run's other settings, refused before anything is probed
    (ProbeOptions' own rules: a WRITE bandwidth run of a number of iterations)."""
    from gdrprobe.measure.options import ProbeOptions

    check_pattern_name(pattern)
    if not pattern:
        return
    ProbeOptions(**{key: value for key, value in settings.items()
                    if value is not None and key != "sizes"}, pattern=pattern)


def pattern_settings(pattern: str | None, environ, device: str | None, ib_port: int,
                     size: int | None, settings: dict) -> tuple[dict, NcclTransport | None]:
    """The run's settings with NCCL's pattern added (its connections as the job's NCCL
    settings shape them, and NCCL's step sizes where no size was asked), and the transport
    settings the answers name; (settings, None) without a pattern."""
    from gdrprobe.nccl.pattern import transport_settings

    if not pattern:
        return settings, None
    transport = transport_settings(environ)
    infiniband, gbps = port_facts(device, ib_port)
    added = {"pattern": pattern, "nccl": pattern_shape(transport, infiniband, gbps)}
    if size is None and settings.get("sizes") is None:
        added["sizes"] = pattern_sizes(transport)
    return {**settings, **added}, transport


def check_options(options, host_gbps: float, shape: NcclShape, transport: NcclTransport):
    """check --pattern nccl's runs: the check's (its flush rule, its QPs for the stream), at
    NCCL's step sizes, each a number of steps with every one checked (no duration): as many
    as the WRITE A/B's host arm moved in one of its windows at the largest step, a ring of
    NCCL_STEPS at least."""
    sizes = pattern_sizes(transport)
    window_s = options.duration_s or MIN_WINDOW_S
    steps = max(STEPS, int(host_gbps * 1e9 / 8 * window_s / max(sizes)))
    return dataclasses.replace(options, pattern="nccl", nccl=shape, sizes=sizes, duration_s=None,
                               window_bytes=None, iterations=steps, sample_integrity=False)

