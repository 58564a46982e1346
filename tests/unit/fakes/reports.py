"""Check reports as the A/B makes them on recorded runs, for the CLI's and the API's tests:
engaged, not testable and inconclusive on a software device, placed on one rank's pair."""

import dataclasses

from gdrprobe.campaign.ab import plan_arms, run_ab
from gdrprobe.errors import NotTestable
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report.check import FloorCheck, RankPair
from tests.unit.fakes.runs import fake_probe

GPU = MemorySpec.from_choice("gpu")
PAIR = RankPair(rank="LOCAL_RANK=0", cuda_ordinal=0, gpu="0000:3b:00.0", gpu_reason="rank 0",
                nic="rxe0", nic_reason="no NIC decision: the first RDMA device",
                time_budget_s=30.0, elapsed_s=4.2, send_gpu="0000:3b:00.0",
                lock="/run/gdrprobe/rxe0.lock, waited 0.0 s")
RXE = FloorCheck("rxe0", 1, 10.0, 0.8, applied=False, software_device=True,
                 note="not applied: a software RDMA device")
REASON = ("auto fell back to peermem: the NIC cannot register DMA-BUF (ibv_reg_dmabuf_mr "
          "returned EOPNOTSUPP) " + "x" * 200)


def not_testable_report():
    error = NotTestable("not testable: no CUDA driver (libcuda.so.1 could not be loaded)",
                        "install the NVIDIA driver", evidence=REASON)
    run_once, _ = fake_probe(gpu_error=error)
    report = run_ab(run_once, plan_arms(GPU, GPU, False), repeats=2, floor=RXE)
    return dataclasses.replace(report, placement=PAIR)


def engaged_report():
    run_once, _ = fake_probe(gpu_gbps=97.0)
    report = run_ab(run_once, plan_arms(GPU, GPU, False), repeats=2, floor=RXE)
    return dataclasses.replace(report, placement=PAIR)


def inconclusive_report():
    run_once, _ = fake_probe(gpu_gbps=97.0)
    report = run_ab(run_once, plan_arms(GPU, GPU, False), repeats=2, floor=RXE)
    straddling = dataclasses.replace(report.verdict, inconclusive=True, evidence=(
        "inconclusive: the per-repeat GPU/host ratios 0.80..0.97 straddle the threshold 0.90",
        *report.verdict.evidence))
    return dataclasses.replace(report, verdict=straddling, placement=PAIR)
