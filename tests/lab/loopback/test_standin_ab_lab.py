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

from tests.lab.helpers import REPO, gdrprobe, gdrprobe_json, over_standin, rdma_resources

pytest.importorskip("cuda.bindings", reason="needs cuda-python in the venv")


def run_over_standin(*args: str, **standin) -> tuple[int, dict]:
    done = run_loopback(*args, "--json", **standin)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def run_loopback(*args: str, **standin) -> subprocess.CompletedProcess:
    """gdrprobe run --loopback over the stand-in, configured by GDRPROBE_STANDIN_<KEY>."""
    return gdrprobe("run", "--loopback", "-n", "100", "-s", "65536", *args,
                    env=over_standin(**standin), timeout=600)


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
    # Allocated as NCCL allocates (VMM, asking for GPUDirect RDMA), registered on rxe.
    assert gpu_memory["allocation"] == "vmm" and gpu_memory["gpu_direct_rdma_capable"]
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


def test_gpu_alloc_malloc_is_cumemalloc(baseline):
    code, report = run_over_standin("--mem", "peermem", "--gpu-alloc", "malloc", "--repeats", "1")
    assert report["arms"][1]["local_memory"]["allocation"] == "malloc"
    assert report["arms"][1]["outcome"] == "measured"
    assert rdma_resources() == baseline


@pytest.mark.parametrize("standin, code, words", [
    ({"fail": "cuInit=802"}, 11, "fabric manager"),                   # every job would crash
    ({"compute_mode": "exclusive-process-held"}, 11, "exclusive-process"),
    ({"fail": "cuMemCreate=2"}, 9, "out of memory"),                  # no answer, no drain
])
def test_what_the_gpu_meets_decides_drain_or_warn(standin, code, words, baseline):
    done = run_loopback("--mem", "peermem", "--repeats", "1", **standin)
    assert done.returncode == code, done.stderr
    assert words in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert rdma_resources() == baseline


PYVERBS_34_TO_43 = """
import json, sys
import pyverbs.mr
from gdrprobe.report.model import to_dict


class DmaBufMR:
    # rdma-core 34-43: pyverbs/mr.pyx types the dmabuf argument as a DmaBuf object.
    def __init__(self, pd, length, access, dmabuf=None, offset=0, gpu=0, gtt=0):
        raise TypeError("Argument 'dmabuf' has incorrect type (expected pyverbs.dmabuf.DmaBuf, "
                        "got int)")


pyverbs.mr.DmaBufMR = DmaBufMR
import gdrprobe
report = gdrprobe.run(loopback=True, mem=sys.argv[1], repeats=1, iterations=100,
                      sizes=(65536,))
print(json.dumps(to_dict(report)))
"""


@pytest.mark.parametrize("mem", ["dmabuf", "gpu"])
def test_a_pyverbs_that_takes_no_fd_registers_through_libibverbs_never_silently(mem, baseline):
    done = subprocess.run([sys.executable, "-c", PYVERBS_34_TO_43, mem], env=over_standin(),
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    arm = report["arms"][1]
    route = "libibverbs' ibv_reg_dmabuf_mr through gdrprobe's extension"
    if mem == "dmabuf":        # rxe's own answer, reached through libibverbs
        assert arm["outcome"] == "registration failed"
        assert report["verdict"]["classification"] == "not engaged"
        assert route in arm["mechanism_reason"]
        assert any("EOPNOTSUPP" in cause for cause in report["verdict"]["likely_causes"])
    else:                      # auto: peermem because rxe refuses, and the reason says how
        assert arm["arm"] == "peermem" and "EOPNOTSUPP" in arm["mechanism_reason"]
        assert f"registered through {route}" in arm["mechanism_reason"]
    assert rdma_resources() == baseline
