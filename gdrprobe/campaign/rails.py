"""Every rail of a node at once (``gdrprobe check --node --all-rails``): after each rail's
A/B alone, every rail's GPU arm runs together, then every rail's host arm, each pass's loops
started behind one barrier, so that contention (rails fine alone that fall only together:
two NICs behind one narrow uplink, a socket's fabric) is told from a slow rail.

A rail is a NIC with the first GPU of the job NCCL pairs with it whose A/B was engaged
alone; GPUs that share a NIC are one rail (they would contend by design). Each loop records
its measured window on the monotonic clock; the windows must overlap by
``defaults.RAILS_MIN_OVERLAP`` of the shortest one, or the rails did not run together and
the answer is inconclusive (exit 12, never a drain), as it is when a rail's run fails
together although it ran alone (its solo answer stands for it). A rail whose GPU arm keeps
less than ``defaults.RAIL_RATIO`` of its solo bandwidth together contends; the report names
the smallest element the contending rails share (:mod:`gdrprobe.doctor.facts.rails`).
Contention is a fact of the platform's design: exit 13, a warning (gdrprobe.errors).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Sequence

from gdrprobe import defaults
from gdrprobe.campaign.gate import MachineFacts
from gdrprobe.report.check import (CONTENTION, INCONCLUSIVE, NO_RAIL, ONE_RAIL, TOGETHER,
                                   LoopWindow, NodeGpuCheck, Overlap, RailResult, RailsReport,
                                   RankPair, ratio_of)

# loop(pair, host, ready) -> LoopWindow: one run of the rail's GPU arm (host: its host arm)
# that calls ready() once set up, just before its loop (campaign.prelaunch.rail_loop).
RailLoop = Callable[[RankPair, bool, Callable[[], object]], LoopWindow]

# How long a rail set up before the others may wait for them at the barrier, per rail in
# flight: opening the device, registering (and with GPU memory pinning) the buffers and the
# out-of-band handshake take well under a second each on a healthy node, but the NIC
# drivers serialise part of the registrations, so the wait grows with the rails; half the
# out-of-band time-out at most, so that no peer gives up on a rail waiting there.
SETUP_S_PER_RAIL = 5.0


def barrier_timeout_s(rails: int, timeout_s: float) -> float:
    return min(timeout_s / 2, SETUP_S_PER_RAIL * rails)


@dataclasses.dataclass(frozen=True)
class Solo:
    """A rail as measured alone: the pair its runs used, its GPU arm's and host arm's
    bandwidth (the node check's A/B medians, or bench's rows at the largest size)."""

    pair: RankPair
    gbps: float
    host_gbps: float | None


def solo_gbps(check: NodeGpuCheck, host: bool = False) -> float | None:
    """The median of the deciding GPU arm alone (host: the host arm's); None where that arm
    measured nothing. Each arm is found by what it is, not by its place among the arms."""
    report = check.report
    if report is None:
        return None
    arm = report.host_arm() if host else report.deciding_arm()
    return arm.median_gbps if arm is not None and arm.outcome == "measured" else None


def rails_of(checks: Sequence[NodeGpuCheck]) -> list[Solo]:
    """One engaged GPU per NIC, in the node's GPU order, as its A/B measured it alone."""
    first: dict[str, Solo] = {}
    for check in checks:
        if check.nic and check.exit_code == 0 and check.nic not in first and (
                gbps := solo_gbps(check)):
            first[check.nic] = Solo(check.report.placement, gbps, solo_gbps(check, host=True))
    return list(first.values())


def together(pairs: Sequence[RankPair], loop: RailLoop, host: bool,
             timeout_s: float) -> list[LoopWindow | Exception]:
    """Every pair's loop at once, each in its own thread, released by one barrier; a loop
    that fails aborts the barrier so the others do not wait for it."""
    barrier = threading.Barrier(len(pairs), timeout=barrier_timeout_s(len(pairs), timeout_s))

    def run(pair: RankPair) -> LoopWindow | Exception:
        try:
            return loop(pair, host, barrier.wait)
        except Exception as error:   # noqa: BLE001 - one rail's failure is the pass's answer
            barrier.abort()
            return error

    with concurrent.futures.ThreadPoolExecutor(len(pairs), thread_name_prefix="gdrprobe-rail") as pool:
        return list(pool.map(run, pairs))


def failure(outcome: LoopWindow | Exception) -> str:
    if isinstance(outcome, threading.BrokenBarrierError):
        return "did not start: another rail failed or did not set up in time"
    return "" if isinstance(outcome, LoopWindow) else f"{type(outcome).__name__}: {outcome}"


def rail_result(alone: Solo, gpu: LoopWindow | Exception, host: LoopWindow | Exception,
                line_rate: float | None, threshold: float) -> RailResult:
    solo, host_solo = alone.gbps, alone.host_gbps
    concurrent = gpu.gbps if isinstance(gpu, LoopWindow) else None
    host_concurrent = host.gbps if isinstance(host, LoopWindow) else None
    ratio = ratio_of(concurrent, solo)
    return RailResult(alone.pair.gpu, alone.pair.nic, solo, concurrent, ratio, host_solo, host_concurrent,
                      ratio_of(host_concurrent, host_solo), line_rate,
                      contending=ratio is not None and ratio < threshold,
                      error=failure(gpu) or failure(host))


def overlap_of(outcomes: Sequence[LoopWindow | Exception]) -> Overlap | None:
    """How far a pass's windows ran at once; None where a rail's loop failed in it."""
    return Overlap.of(outcomes) if all(isinstance(outcome, LoopWindow) for outcome in outcomes) else None


def windows_apart(overlaps: Sequence[Overlap]) -> str:
    """Why the passes' windows do not count as together ("" where they do)."""
    short = [overlap for overlap in overlaps if overlap.fraction < defaults.RAILS_MIN_OVERLAP]
    if not short:
        return ""
    worst = min(short, key=lambda overlap: overlap.fraction)
    return (f"the rails' windows overlapped for {worst.fraction:.0%} of the shortest one "
            f"(start skew {worst.skew_s * 1000:.1f} ms against {worst.shortest_s * 1000:.1f} ms), "
            f"less than {defaults.RAILS_MIN_OVERLAP:.0%}: they did not run together")


def shared_by(facts: MachineFacts, results: Sequence[RailResult], port: int) -> dict | None:
    """The smallest element the rails share, as JSON; None where the doctor placed no
    GPU or NIC of theirs (a VM without PCI functions, a software NIC)."""
    from gdrprobe.doctor.facts.rails import Rail, shared_element

    if facts.topology is None:
        return None
    gpus = {gpu.bdf: gpu for gpu in facts.topology.gpus}
    nics = {nic.name: nic for nic in facts.topology.nics}
    rails = [Rail(gpus[result.gpu], nics[result.nic]) for result in results
             if result.gpu in gpus and result.nic in nics]
    if len(rails) < len(results):
        return None
    element = shared_element(rails, facts.pcie_links,
                             {rail.nic.name: facts.line_rate(rail.nic.name, port) for rail in rails})
    return element.as_json() if element else None


def check_rails(rails: Sequence[Solo], facts: MachineFacts, loop: RailLoop,
                timeout_s: float, port: int = 1,
                threshold: float = defaults.RAIL_RATIO) -> RailsReport:
    """Every rail at once after each alone (``rails``: one per NIC, as measured alone)."""
    if not rails:
        return RailsReport.of(NO_RAIL, (), ratio_threshold=threshold,
                              detail="no rail engaged alone: nothing to run together")
    if len(rails) < 2:
        return RailsReport.of(ONE_RAIL, (), ratio_threshold=threshold,
                              detail="one rail engaged alone: nothing to run together")
    pairs = [alone.pair for alone in rails]
    gpu_pass = together(pairs, loop, False, timeout_s)
    host_pass = together(pairs, loop, True, timeout_s)
    results = tuple(rail_result(alone, gpu, host, facts.line_rate(alone.pair.nic, port), threshold)
                    for alone, gpu, host in zip(rails, gpu_pass, host_pass))
    failed = [f"{result.gpu} ({result.nic}): {result.error}" for result in results if result.error]
    overlap, host_overlap = overlap_of(gpu_pass), overlap_of(host_pass)
    measured = dict(ratio_threshold=threshold, overlap=overlap, host_overlap=host_overlap)
    if failed:
        return RailsReport.of(INCONCLUSIVE, results, detail="a rail's run failed together, though "
                              "it ran alone: " + "; ".join(failed), **measured)
    apart = windows_apart([found for found in (overlap, host_overlap) if found is not None])
    if apart:
        return RailsReport.of(INCONCLUSIVE, results, detail=apart, **measured)
    contending = [result for result in results if result.contending]
    if not contending:
        return RailsReport.of(TOGETHER, results, **measured)
    shared = shared_by(facts, contending if len(contending) > 1 else results, port)
    return RailsReport.of(CONTENTION, results, shared=shared, detail=(
        f"{len(contending)} of {len(results)} rails keep less than {threshold:.2f} of their solo "
        "bandwidth together" + (f"; they share the {shared['description']}" if shared else "")),
        **measured)
