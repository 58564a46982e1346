"""The ROCm path through the same commands over real verbs (issue 33): gdrprobe under AMD's
hip-python over the stand-in HIP runtime and HSA (tests/rocm_standin) in this Soft-RoCE
guest: check, check --node, bench and cluster, each to its answer.

The stand-in's "GPU" memory is host memory and rxe registers no DMA-BUF, so auto takes
amdkfd's peer-memory route and rxe reads and writes the buffers: the commands' plumbing on
the second GPU runtime (the mechanism named, every message verified, nothing leaked), not
GPU proof. The dma-buf route on ROCm runs in ./dev demo-rocm (lab/modules.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from gdrprobe.errors import ExitCode
from tests.lab.helpers import MPI_ENV, REPO, rdma_resources

# hip-python's own venv (./dev's HIP_VENV: the binding suite makes it before the lab runs)
HIP_PYTHON = os.path.join(REPO, ".venv-hip-python", "bin", "python")
ROCM_MECHANISM = "peermem (amdkfd)"
STANDIN_GPU = "0000:1b:00.0"            # the stand-in's first GPU (standin.c)

pytestmark = pytest.mark.skipif(not os.access(HIP_PYTHON, os.X_OK),
                                reason="no hip-python venv: ./dev bindings makes it")


@pytest.fixture
def rocm_env(tmp_path) -> dict:
    from tests.rocm_standin.build import environment

    env = environment() | {"GDRPROBE_GPU_RUNTIME": "rocm", "PYTHONPATH": REPO,
                           "GDRPROBE_LOCK_DIR": str(tmp_path)}
    env.pop("LOCAL_RANK", None)
    return env


def on_rocm(env: dict, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    done = subprocess.run([*prefix, HIP_PYTHON, "-m", "gdrprobe", *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env=env)
    assert done.stdout, done.stderr
    return done


def assert_measured_on_rocm(verdict: dict, code: int) -> None:
    """A measured answer through amdkfd's peer memory, its exit code the process's; host
    pages against host pages may land either side of the threshold, never as a fault."""
    assert verdict["mechanism"] == ROCM_MECHANISM, verdict
    assert verdict["classification"] in ("engaged", "degraded"), verdict
    assert code == verdict["exit_code"]
    assert code in (ExitCode.OK, ExitCode.VERDICT_NOT_OK, ExitCode.INCONCLUSIVE)


def test_check_names_amdkfd_and_verifies_every_message(rocm_env, baseline):
    done = on_rocm(rocm_env, "check", "--time-budget", "120", "-s", "64K", "--repeats", "2",
                   "--json")
    report = json.loads(done.stdout)
    assert_measured_on_rocm(report["verdict"], done.returncode)
    gpu = report["arms"][1]
    for side in ("local_memory", "remote_memory"):
        assert gpu[side]["kind"] == "gpu" and gpu[side]["mechanism"] == "peermem", gpu[side]
        assert gpu[side]["pci_bus_id"] == STANDIN_GPU and gpu[side]["peer_memory"] == "amdkfd"
    assert report["settings"]["integrity"].startswith("every message checked")
    assert rdma_resources() == baseline


def test_check_node_checks_the_rocm_gpu(rocm_env, baseline):
    done = on_rocm(rocm_env, "check", "--node", "--time-budget", "120", "-s", "64K",
                   "--repeats", "1", "--json")
    report = json.loads(done.stdout)
    assert report["kind"] == "check-node"
    (entry,) = report["gpus"]
    assert entry["nic"] == "rxe0"
    assert_measured_on_rocm(entry["report"]["verdict"], entry["report"]["verdict"]["exit_code"])
    assert done.returncode == report["exit_code"]
    assert rdma_resources() == baseline


def test_bench_sweeps_rocm_memory_by_peermem(rocm_env, tmp_path, baseline):
    output = tmp_path / "bench.json"
    done = on_rocm(rocm_env, "bench", "--sizes", "64K", "--qp", "1", "--mem", "host,peermem",
                   "-n", "200", "--latency-iters", "100", "--output", str(output))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(output.read_text())["rows"]
    peermem = [r for r in rows if r["memory"] == "peermem"]
    assert peermem and {r["outcome"] for r in peermem} == {"measured"}, peermem
    assert all(r["bandwidth_avg_gbps"] > 0 for r in peermem if r["mode"] == "bandwidth")
    assert rdma_resources() == baseline


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI is not installed")
def test_cluster_measures_rocm_memory_between_ranks(rocm_env, baseline):
    forwarded = [arg for name in ("LD_LIBRARY_PATH", "GDRPROBE_GPU_RUNTIME", "PYTHONPATH")
                 for arg in ("-x", name)]
    done = on_rocm(rocm_env | MPI_ENV, "cluster", "--mem", "gpu", "-s", "65536", "-n", "200",
                   "--json", "--slow-fraction", "0.01",
                   prefix=("mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                           *forwarded))
    report = json.loads(done.stdout)
    (pair,) = report["pairs"]
    assert not pair["error"], pair
    assert pair["host_gbps"] > 0 and pair["gpu_gbps"] > 0, pair
    assert pair["verdict"] in ("engaged", "degraded"), pair
    # rank 0 exits with the pair's code, and mpirun with rank 0's
    assert done.returncode == report["exit_code"] == pair["exit_code"]
    assert pair["exit_code"] in (ExitCode.OK, ExitCode.VERDICT_NOT_OK, ExitCode.INCONCLUSIVE)
    assert rdma_resources() == baseline
