"""The sweep's plan (``gdrprobe bench``): which pairs, memory kinds and QP counts, each run's
options, and what runs a run; what the sweep (:mod:`gdrprobe.campaign.bench`) and the rails
after it (:mod:`gdrprobe.campaign.bench_rails`) share. Pure data."""

from __future__ import annotations

import dataclasses
from typing import Callable
from collections.abc import Iterable, Mapping

from gdrprobe.measure.options import ProbeOptions

MEASURED = "measured"     # a row's outcome where it was measured


@dataclasses.dataclass(frozen=True)
class PairPlan:
    gpu: str        # the GPU's selector: PCI bus id, or CUDA ordinal when unknown
    nic: str
    reason: str     # why this NIC for this GPU


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run of the sweep: every size of one mode, memory kind and QP count on a pair."""

    mode: str       # bandwidth | latency
    gpu: str        # "" for host memory
    nic: str
    memory: str
    qps: int


@dataclasses.dataclass(frozen=True)
class BenchPlan:
    pairs: tuple[PairPlan, ...]
    memory_kinds: tuple[str, ...]
    qps: tuple[int, ...]
    options: ProbeOptions           # sizes, iterations or duration, queue settings
    latency_iterations: int = 1000  # 0: no latency rows
    # GPU -> what asks its receive buffer for NCCL's flush ("": nothing; see nccl_use)
    flushes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # --pattern nccl: NIC -> the connections NCCL opens on it; the job's transport settings
    shapes: Mapping[str, object] = dataclasses.field(default_factory=dict)
    transport: object = None

    def nics(self) -> list[str]:
        return list(dict.fromkeys(pair.nic for pair in self.pairs))

    def runs(self) -> list[RunPlan]:
        """Per NIC: host bandwidth per QP count and host latency, then each of its pairs'
        GPU kinds, so every GPU row has its host reference before it."""
        runs = []
        for nic in self.nics():
            if "host" in self.memory_kinds:
                runs += [RunPlan("bandwidth", "", nic, "host", qps) for qps in self.qps]
            if self.latency_iterations:
                runs.append(RunPlan("latency", "", nic, "host", 1))
            runs += [RunPlan("bandwidth", pair.gpu, nic, kind, qps)
                     for pair in self.pairs if pair.nic == nic
                     for kind in self.memory_kinds if kind != "host" for qps in self.qps]
        return runs

    def run_options(self, run: RunPlan) -> ProbeOptions:
        if run.mode == "latency":
            return dataclasses.replace(
                self.options, mode="latency", sizes=latency_sizes(self.options.sizes),
                iterations=self.latency_iterations, warmup_iterations=0, duration_s=None, qps=1,
                tx_depth=1, cq_moderation=1, post_list=1, bidir=False)
        # NCCL flushes what its NIC wrote into GPU memory: a READ run writes nothing there;
        # a bidirectional one checks every message both ways instead (measure/options.py).
        flushed = run.gpu and not self.options.reads and not self.options.bidir
        pattern = {"pattern": "nccl", "nccl": self.shapes[run.nic]} if self.shapes else {}
        return dataclasses.replace(self.options, qps=run.qps,
                                   flush=self.flushes.get(run.gpu, "") if flushed else "",
                                   **pattern)

    def row_count(self) -> int:
        """How many rows the sweep will produce: the length of its progress bar."""
        return sum(len(self.run_options(run).sizes) for run in self.runs())


def latency_sizes(sizes: Iterable[int]) -> tuple[int, ...]:
    """The latency loop needs 2 bytes at least (the peer polls the last byte)."""
    return tuple(dict.fromkeys(max(2, size) for size in sizes))


# (run, its options, on_result) -> None: runs one run of the sweep (bench.loopback_executor)
Execute = Callable[[RunPlan, ProbeOptions, Callable[[object], None]], None]
