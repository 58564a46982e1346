"""``gdrprobe bench --all-rails``: after the sweep, every rail at once
(:mod:`gdrprobe.campaign.rails`), each rail alone being the sweep's own rows at the largest
size and QP count, so the rails together are measured as the sweep measured them alone."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from gdrprobe.campaign.bench_plan import MEASURED, BenchPlan, Execute, RunPlan
from gdrprobe.campaign.gate import MachineFacts
from gdrprobe.campaign.rails import RailLoop, Solo, check_rails
from gdrprobe.report.check import LoopWindow, RailsReport, RankPair
from gdrprobe.report.model import BenchRow


def largest(plan: BenchPlan) -> tuple[int, int]:
    """The size and QP count the rails run at: the sweep's largest."""
    return max(plan.options.sizes), max(plan.qps)


def bench_solos(plan: BenchPlan, rows: Sequence[BenchRow]) -> dict[str, tuple[Solo, str]]:
    """Per NIC, its first pair whose first GPU memory kind measured at the largest size and
    QP count, with that row's bandwidth and the host row's of the same NIC, and the kind."""
    size, qps = largest(plan)
    at = {(row.gpu, row.nic, row.memory): row.bandwidth_avg_gbps for row in rows
          if row.mode == "bandwidth" and row.outcome == MEASURED and row.size_bytes == size
          and row.qps == qps}
    solos: dict[str, tuple[Solo, str]] = {}
    for pair in plan.pairs:
        kind = next((kind for kind in plan.memory_kinds
                     if kind != "host" and (pair.gpu, pair.nic, kind) in at), None)
        if kind is not None and pair.nic not in solos:
            alone = Solo(RankPair("", None, pair.gpu, "as the sweep paired it", pair.nic, pair.reason),
                         at[(pair.gpu, pair.nic, kind)], at.get(("", pair.nic, "host")))
            solos[pair.nic] = (alone, kind)
    return solos


def bench_loop(plan: BenchPlan, execute: Execute, kinds: dict[str, str]) -> RailLoop:
    """One rail's run at the largest size and QP count through the sweep's own executor,
    its GPU arm in the memory kind (``kinds``: by NIC) it was measured in alone."""
    size, qps = largest(plan)

    def loop(pair: RankPair, host: bool, ready) -> LoopWindow:
        run = RunPlan("bandwidth", "" if host else pair.gpu, pair.nic,
                      "host" if host else kinds[pair.nic], qps)
        options = dataclasses.replace(plan.run_options(run), sizes=(size,))
        windows: list[LoopWindow] = []

        def seen(result) -> None:
            windows.append(LoopWindow.ended_now(result, time.monotonic()))

        execute(run, options, seen, on_ready=ready)
        return windows[-1]

    return loop


def bench_rails(plan: BenchPlan, rows: Sequence[BenchRow], facts: MachineFacts,
                execute: Execute, port: int) -> RailsReport:
    """Every rail at once after the sweep measured each alone."""
    solos = bench_solos(plan, rows)
    kinds = {nic: kind for nic, (_, kind) in solos.items()}
    return check_rails([alone for alone, _ in solos.values()], facts,
                       bench_loop(plan, execute, kinds), plan.options.timeout_s, port)
