"""The whole A/B through real verbs over the stand-in libcuda.so.1 (tests/cuda_standin).

What this is: in this Soft-RoCE guest the stand-in's "device memory" is host memory, so
the peermem route registers it on rxe and a GPU arm runs end to end with real verbs:
allocation, registration, the NIC's writes, the flush, the copies back, the integrity
check, the verdict. The DMA-BUF route exports a memfd-backed range and reaches rxe's real
EOPNOTSUPP. What it is not: a GPU, or any proof about GPUDirect; the ratios here compare
host memory with host memory. Relaxed ordering (on by default, as in NCCL) is checked to
register on rxe too.
"""

import json
import subprocess
import sys

import pytest

from tests.cuda_standin.build import environment
from tests.lab.helpers import REPO, gdrprobe_json, rdma_resources

pytest.importorskip("cuda.bindings", reason="needs cuda-python in the venv")


def run_over_standin(*args: str) -> tuple[int, dict]:
    env = environment()
    env["PYTHONPATH"] = REPO
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "run", "--loopback", "-n", "100",
                           "-s", "65536", *args, "--json"], env=env, capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize("side", ["--mem", "--remote-mem"])
def test_a_peermem_arm_runs_end_to_end_over_the_standin(side, baseline):
    code, report = run_over_standin(side, "peermem", "--staged", "--repeats", "1")
    verdict = report["verdict"]
    # Host memory against host memory: either answer is possible; it must be a measured one.
    assert verdict["classification"] in ("engaged", "degraded"), verdict
    assert code == (0 if verdict["classification"] == "engaged" else 1)
    host, gpu, staged = report["arms"]
    assert gpu["arm"] == "peermem" and gpu["outcome"] == "measured"
    gpu_memory = gpu["local_memory"] if side == "--mem" else gpu["remote_memory"]
    assert gpu_memory["pci_bus_id"] == "0000:3b:00.0"        # the stand-in's first "GPU"
    assert gpu_memory["mechanism"] == "peermem" and gpu_memory["gpudirect_proof"]
    assert staged["outcome"] == "measured"
    assert len(staged["pipelined_bound_gbps"]) == len(staged["bandwidths_gbps"]) >= 1
    assert rdma_resources() == baseline


def test_the_dmabuf_route_reaches_rxes_eopnotsupp(baseline):
    code, report = run_over_standin("--mem", "dmabuf", "--repeats", "1")
    assert code == 1 and report["verdict"]["classification"] == "not engaged"
    arm = report["arms"][1]
    assert arm["arm"] == "dmabuf" and arm["outcome"] == "registration failed"
    assert any("EOPNOTSUPP" in cause for cause in report["verdict"]["likely_causes"])
    assert rdma_resources() == baseline


@pytest.mark.parametrize("setting, registered", [("on", True), ("off", False)])
def test_relaxed_ordering_registers_on_rxe_and_is_reported(setting, registered):
    report = gdrprobe_json("run", "--loopback", "-n", "50", "--relaxed-ordering", setting)
    assert report["local"]["memory"]["relaxed_ordering"] is registered
    assert report["remote"]["memory"]["relaxed_ordering"] is registered
    assert all(row["integrity"]["bad_bytes"] == 0 == row["integrity"]["stray_bytes"]
               for row in report["bandwidth"])
