"""The node check for a prolog (``gdrprobe check --node``, ``check_node()``): every GPU of
the job with the NIC NCCL will use for it, in one process.

The job's GPUs are those its launcher or scheduler names (:mod:`gdrprobe.campaign.job_gpus`:
``--gpu``, SLURM_STEP_GPUS, SLURM_JOB_GPUS, NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES);
with none named, every GPU of the node. A named GPU this node has no match for, or one CUDA
does not show this process, is that GPU's answer: not testable. A job with no GPU here has
nothing to measure: not testable (exit 9, warn), never a drain. The job has not started, so
a GPU of the job another process holds is a fault it would meet (exit 11); one that is not
the job's is not (:func:`gdrprobe.campaign.prelaunch.held_elsewhere`).

One doctor and one CUDA start-up serve every GPU (the caller reads the machine once).
GPUs that share a NIC are checked one after the other, each taking an equal share of what
the budget has left when its turn comes; different NICs are checked at the same time, one
thread each (the loops run with the GIL released). Each check also takes its NIC's lock
file, so a ``require()`` in a job on the same node never measures against it. The node's
exit code is the worst GPU's: a code that drains before one that warns, and among those
the larger.

The NICs share one process's locked-memory limit: the checks are fitted to it
(:func:`gdrprobe.campaign.memlock.fit_node_to_memlock`), with fewer integrity slots each,
and where that is not enough with fewer NICs at a time (lanes of whole NICs, the others
later in the same lane), so gdrprobe's own footprint never makes a registration fail.

With ``all_rails`` (``check --node --all-rails``) the NICs are checked one at a time, so
each rail's A/B is its solo answer, and then every rail runs at once
(:mod:`gdrprobe.campaign.rails`) on what the budget has left, one A/B's share kept for it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Callable
from collections.abc import Mapping

from gdrprobe.campaign import memlock
from gdrprobe.campaign.gate import NO_GPU_FOUND, Budget, MachineFacts, node_pairs
from gdrprobe.campaign.job_gpus import JobGpuSet, job_gpus, node_gpus
from gdrprobe.campaign.memlock import LockedMemory, NodeFit, fit_node_to_memlock
from gdrprobe.campaign.plan import CheckPlan, read_machine
from gdrprobe.campaign.prelaunch import check_pair, rail_loop
from gdrprobe.campaign.rails import RailLoop, check_rails, rails_of
from gdrprobe.errors import ExitCode, GdrprobeError, worst_exit_code
from gdrprobe.measure.options import MIN_TIMEOUT_S
from gdrprobe.report.check import (INCONCLUSIVE, NO_GPU_LABEL, NodeCheckReport, NodeGpuCheck,
                                   RailsReport, RankPair)

CheckPair = Callable[[RankPair, MachineFacts, CheckPlan, Budget, Mapping[str, str]], object]
# (facts, gate, seconds for one run, environ) -> the loop of one rail (prelaunch.rail_loop)
MakeRailLoop = Callable[[MachineFacts, CheckPlan, float, Mapping[str, str]], RailLoop]
# Without a budget, each pass of every rail at once is sized as for a budget of this much.
UNBUDGETED_PASS_S = 2.0


def by_nic(pairs: list[RankPair]) -> list[list[RankPair]]:
    """The GPUs grouped by NIC (no NIC known: one group), in the node's GPU order."""
    groups: dict[str, list[RankPair]] = {}
    for pair in pairs:
        groups.setdefault(pair.nic or "", []).append(pair)
    return list(groups.values())


def in_lanes(groups: list[list[RankPair]], lanes: int) -> list[list[RankPair]]:
    """The NICs' groups in `lanes` lanes that run at the same time, each lane its groups
    one after the other: the largest group first, into the lane with the fewest GPUs."""
    filled: list[list[RankPair]] = [[] for _ in range(min(lanes, len(groups)))]
    for group in sorted(groups, key=len, reverse=True):
        min(filled, key=len).extend(group)
    return filled


def check_one(pair: RankPair, facts: MachineFacts, gate: CheckPlan, seconds: float | None,
              environ: Mapping[str, str], check: CheckPair) -> NodeGpuCheck:
    """One GPU's check on its share of the budget; an error is its answer, not the node's."""
    checked = checking(pair, facts, gate, seconds, environ, check)
    if pair.gpu_reason == NO_GPU_FOUND:
        return dataclasses.replace(checked, label=NO_GPU_LABEL)
    return checked


def checking(pair: RankPair, facts: MachineFacts, gate: CheckPlan, seconds: float | None,
             environ: Mapping[str, str], check: CheckPair) -> NodeGpuCheck:
    if seconds is not None and seconds <= 0:
        return NodeGpuCheck(pair.gpu, pair.nic, int(ExitCode.NOT_TESTABLE),
                            error="not testable: the node check's time budget ran out "
                                  "before this GPU's turn",
                            fix="give the node check a larger --time-budget")
    try:
        report = check(pair, facts, gate, Budget(seconds), environ)
    except GdrprobeError as error:
        return NodeGpuCheck(pair.gpu, pair.nic, int(error.exit_code), error=error.cause,
                            fix=error.fix)
    except Exception as error:   # noqa: BLE001 - a bug in one GPU's check is not the node's
        return NodeGpuCheck(pair.gpu, pair.nic, int(ExitCode.INTERNAL),
                            error=f"internal error: {type(error).__name__}: {error}",
                            fix="a bug in gdrprobe, not a fault of this node: please report "
                                "it ('gdrprobe check --gpu' on this GPU shows where)")
    return NodeGpuCheck(pair.gpu, report.placement.nic, report.verdict.exit_code, report)


def not_testable(gpu: str, why: str) -> NodeGpuCheck:
    return NodeGpuCheck(gpu, None, int(ExitCode.NOT_TESTABLE), error=f"not testable: {why}",
                        fix="name the job's GPUs as this node knows them (docs/check.md, "
                            "'The job's GPUs')")


def unchecked(job: JobGpuSet, visible: tuple[str, ...] | None) -> list[NodeGpuCheck]:
    """The job's GPUs no check can open: named but not on this node, or hidden from CUDA in
    this process."""
    missing = [not_testable(name, why) for name, why in job.unmatched]
    if visible is not None and job.job is not None:
        missing += [not_testable(bus_id, "CUDA does not show this GPU to this process "
                                         "(CUDA_VISIBLE_DEVICES)")
                    for bus_id in job.bus_ids if bus_id not in visible]
    return missing


def all_rails(checks: tuple[NodeGpuCheck, ...], facts: MachineFacts, gate: CheckPlan,
              budget: Budget, environ: Mapping[str, str], make_loop: MakeRailLoop,
              fit: NodeFit) -> RailsReport:
    """Every rail at once on what the budget has left (two passes: GPU arms, host arms),
    where the locked-memory limit holds every rail's runs at once (``fit``)."""
    rails = rails_of(checks)
    if len(rails) > fit.at_once:
        return RailsReport.of(INCONCLUSIVE, (), detail=(
            f"the locked-memory limit holds {fit.at_once} NICs' runs at once, not the "
            f"{len(rails)} rails ({fit.note}): raise it (ulimit -l, LimitMEMLOCK) to run "
            "every rail together"))
    seconds = UNBUDGETED_PASS_S if budget.seconds is None else budget.remaining() / 2
    if budget.seconds is not None and seconds < MIN_TIMEOUT_S:
        return RailsReport.of(INCONCLUSIVE, (), detail=(
            f"the time budget left {max(seconds, 0.0) * 2:.1f} s after each rail alone, too "
            f"little to run them together ({2 * MIN_TIMEOUT_S:g} s at least): give the node "
            "check a larger --time-budget"))
    if budget.seconds is not None:     # each run's out-of-band steps wait no longer than its pass
        gate = dataclasses.replace(gate, options=dataclasses.replace(
            gate.options, timeout_s=min(gate.options.timeout_s, seconds)))
    return check_rails(rails, facts, make_loop(facts, gate, seconds, environ),
                       gate.options.timeout_s, gate.endpoint.port)


def check_job(gate: CheckPlan, gpus: str | None, every_rail: bool,
              environ: Mapping[str, str]) -> NodeCheckReport:
    """check_node(): the job's GPUs as named (gpus, else the launcher's and scheduler's
    variables: a malformed list is refused before the doctor), the budget started, the
    machine read once with the job's GPUs matched there, and every GPU checked."""
    job = job_gpus(environ, gpus)
    budget = Budget(gate.time_budget_s)
    facts, gate = read_machine(gate, job)
    return check_node(facts, gate, budget, environ, every_rail=every_rail)


def check_node(facts: MachineFacts, gate: CheckPlan, budget: Budget,
               environ: Mapping[str, str], check: CheckPair = check_pair,
               memory: LockedMemory | None = None,
               every_rail: bool = False, make_loop: MakeRailLoop = rail_loop) -> NodeCheckReport:
    """The job's GPUs (facts.job: as named and matched; None: every GPU of the node), one
    A/B per NIC at a time, NICs in parallel as far as the locked-memory limit (memory: this
    process's unless given) holds them; with every_rail, one NIC at a time, then every rail
    at once."""
    gpus = facts.job or JobGpuSet(None, node_gpus(facts.gpus))
    visible = facts.gpus.runtime_bus_ids
    missing = unchecked(gpus, visible)
    named = None if gpus.job is None else tuple(bus_id for bus_id in gpus.bus_ids
                                                if visible is None or bus_id in visible)
    pairs = [] if named == () else node_pairs(facts.gpus, facts.nics, named, gpus.described)
    # The job has not started: a GPU of its own that another process holds is a fault.
    gate = dataclasses.replace(gate, job_gpus=gpus.bus_ids)
    results: dict[int, NodeGpuCheck] = {}
    cancelled = threading.Event()
    fit = fit_node_to_memlock(gate.options, gate.peer.ends_here, len(by_nic(pairs)),
                              memory or memlock.locked_memory())
    gate = dataclasses.replace(gate, options=fit.options)

    def run_group(group: list[RankPair]) -> None:
        for turn, pair in enumerate(group):
            if cancelled.is_set():
                return
            # all rails at once keeps one GPU's share for itself
            seconds = (None if budget.seconds is None
                       else budget.remaining() / (len(group) - turn + every_rail))
            results[pairs.index(pair)] = check_one(pair, facts, gate, seconds, environ, check)

    groups = in_lanes(by_nic(pairs), 1 if every_rail else fit.at_once)
    with concurrent.futures.ThreadPoolExecutor(max(1, len(groups)),
                                               thread_name_prefix="gdrprobe-nic") as pool:
        futures = [pool.submit(run_group, group) for group in groups]
        try:
            for future in futures:
                future.result()
        except BaseException:
            cancelled.set()    # the GPUs not started yet stay so; the running ones finish
            raise
    checks = tuple(results[index] for index in sorted(results)) + tuple(missing)
    rails = (all_rails(checks, facts, gate, budget, environ, make_loop, fit) if every_rail
             else None)
    nothing = int(ExitCode.NOT_TESTABLE) if not checks else int(ExitCode.OK)
    codes = [check.exit_code for check in checks] + ([rails.exit_code] if rails else [])
    return NodeCheckReport(gpus=checks, time_budget_s=budget.seconds,
                           elapsed_s=round(budget.elapsed(), 3),
                           exit_code=worst_exit_code(codes, nothing),
                           memlock=fit.note, job_gpus=gpus.described, rails=rails)
