"""The NCCL-pattern arm's reports (``--pattern nccl``): one size's round as measured, its
answer against the stream of the same size, and the A/B's comparison of the GPU arm's
pattern with the host arm's. Part of the one report model (:mod:`gdrprobe.report.model`),
serialised by its :func:`~gdrprobe.report.model.to_json`; the text renderers are here too."""

from __future__ import annotations

import dataclasses

from gdrprobe.report.model import Integrity

SUSTAINS = "sustains"                 # the path keeps NCCL's pattern near the stream's rate
ROUND_TRIP_BOUND = "round-trip bound"  # NCCL_STEPS steps per step time fall short of it
BELOW_PREDICTION = "below prediction"  # neither: the pattern fell short of its own bound
PHASES = ("clear-to-send", "data", "flush")


@dataclasses.dataclass(frozen=True)
class StepPhases:
    """A step's time and its phases, medians in microseconds. ``alone`` (one step in
    flight): step = clear-to-send + data + flush, where data is the sender's post to the
    completion of its last WRITE (the bytes, their way to the receiver and the
    acknowledgement back), flush the receiver's READ, and clear-to-send the rest (the
    receiver's completion, its next clear-to-send and that reaching the sender). ``loaded``
    (NCCL_STEPS in flight): the same step time and flush, data as alone, and clear-to-send
    the sender's wait for it once it had the step ready."""

    step_us: float
    cts_us: float
    data_us: float
    flush_us: float

    def phase(self, name: str) -> float:
        return {"clear-to-send": self.cts_us, "data": self.data_us, "flush": self.flush_us}[name]


@dataclasses.dataclass(frozen=True)
class NcclPatternResult:
    """One size's NCCL-pattern round: the size as each step, every connection's steps
    NCCL_STEPS deep after one pass of steps alone, every step's bytes checked."""

    size_bytes: int
    channels: int
    qps_per_connection: int
    split: bool
    adaptive_routing: bool
    steps_in_flight: int
    steps: int                     # per channel, in the loaded passes
    elapsed_s: float               # the receiver's time for them (pass checks left out)
    rate_gbps: float               # every channel together
    connection_gbps: float         # per connection
    alone: StepPhases
    loaded: StepPhases
    ceiling_gbps: float            # per connection: steps in flight x size / a step alone
    integrity: Integrity
    passes: int = 0


@dataclasses.dataclass(frozen=True)
class NcclAnswer:
    """One size's answer: does the path sustain NCCL's pattern, or does the round trip of a
    step cap what NCCL can move per connection, and what would raise it."""

    size_bytes: int
    shape: str                     # p2p (NCCL_P2P_NET_CHUNKSIZE) | collective (NCCL_BUFFSIZE / 8) | ""
    stream_gbps: float
    pattern_gbps: float
    channels: int
    ceiling_gbps: float            # per connection
    predicted_gbps: float          # min(stream, channels x ceiling)
    outcome: str                   # sustains | round-trip bound | below prediction
    text: str
    raise_by: tuple[str, ...] = ()   # NCCL's own parameters that would raise the ceiling
    settings: tuple[str, ...] = ()   # the settings that shaped the steps, each with its value


@dataclasses.dataclass(frozen=True)
class NcclPatternRatio:
    """One size in the A/B: the GPU arm's pattern rate against the host arm's, per repeat,
    and the phase of a step alone that grew most."""

    size_bytes: int
    host_gbps: float               # medians over the repeats
    gpu_gbps: float
    ratio: float                   # median of the paired per-repeat ratios
    ratios: tuple[float, ...]
    host_alone: StepPhases
    gpu_alone: StepPhases
    phase: str                     # clear-to-send | data | flush: the one that grew most


@dataclasses.dataclass(frozen=True)
class NcclPatternCheck:
    """The A/B's NCCL pattern: within (the GPU arm keeps the host arm's pattern), degraded
    (it falls below while its stream keeps up: the verdict joins it), inconclusive, or not
    run; each size's ratio and the host and GPU arms' answers."""

    outcome: str
    detail: str
    ratios: tuple[NcclPatternRatio, ...] = ()
    host: tuple[NcclAnswer, ...] = ()
    gpu: tuple[NcclAnswer, ...] = ()


# ---- text --------------------------------------------------------------------------------

def _gbps(value: float) -> str:
    return f"{value:.3f} Gb/s" if value < 10 else f"{value:.1f} Gb/s"


def phases_text(phases: StepPhases) -> str:
    return (f"{phases.step_us:.1f} us (clear-to-send {phases.cts_us:.1f}, data "
            f"{phases.data_us:.1f}, flush {phases.flush_us:.1f})")


def render_result(result: NcclPatternResult) -> list[str]:
    checked = result.integrity
    return [
        f"  {result.size_bytes} B steps, {result.channels} channel(s) x "
        f"{result.qps_per_connection} QP(s), {result.steps_in_flight} in flight: "
        f"{_gbps(result.rate_gbps)} ({_gbps(result.connection_gbps)} per connection), "
        f"{result.steps} steps per connection, {checked.messages_checked} checked"
        + (f", {checked.flush_reads} flushed" if checked.flush_reads else ""),
        f"    a step alone: {phases_text(result.alone)}; ceiling "
        f"{_gbps(result.ceiling_gbps)} per connection",
        f"    steps in flight: {phases_text(result.loaded)}"]


def render_answer(answer: NcclAnswer) -> list[str]:
    lines = [f"  {answer.size_bytes} B ({answer.shape or 'as asked'}): {answer.text}"]
    lines += [f"    would raise it: {item}" for item in answer.raise_by]
    lines += [f"    settings: {', '.join(answer.settings)}"] if answer.settings else []
    return lines


def render_run_pattern(results, answers) -> list[str]:
    """A run's NCCL-pattern section: each round, then each size's answer."""
    if not results:
        return []
    lines = ["NCCL's pattern (its IB transport's steps: clear-to-send, data, flush):"]
    for result in results:
        lines += render_result(result)
    for answer in answers:
        lines += render_answer(answer)
    return lines


def render_check_pattern(check: NcclPatternCheck | None) -> list[str]:
    if check is None:
        return []
    lines = [f"NCCL's pattern: {check.outcome}" + (f": {check.detail}" if check.detail else "")]
    for ratio in check.ratios:
        lines.append(f"  {ratio.size_bytes} B steps: GPU {_gbps(ratio.gpu_gbps)}, host "
                     f"{_gbps(ratio.host_gbps)} (x{ratio.ratio:.2f}); a step alone: GPU "
                     f"{phases_text(ratio.gpu_alone)}, host {phases_text(ratio.host_alone)}")
    for arm, answers in (("host", check.host), ("GPU", check.gpu)):
        for answer in answers:
            lines.append(f"  {arm} arm, {answer.size_bytes} B: {answer.text}")
    return lines
