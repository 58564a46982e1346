"""What a newcomer meets first, in the guest (rxe, no CUDA driver, the kernel's 8 MiB
memlock default): the default loopback run works for a user without CAP_IPC_LOCK, and a GPU
A/B that cannot run here says so before measuring anything."""

import json
import os
import subprocess
import sys

import pytest

from tests.lab.helpers import REPO, gdrprobe, over_standin, rdma_resources

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def test_a_user_at_the_stock_memlock_limit_runs_the_default_loopback():
    """As nobody (no CAP_IPC_LOCK) under 8 MiB, both ends' default buffers (64 slots of
    64 KiB and one past them, each) would not register; the run keeps fewer slots."""
    done = subprocess.run([*NOBODY, "bash", "-c",
                           f"ulimit -l 8192 && exec {sys.executable} -m gdrprobe run --loopback"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "integrity slots of 65536 B per end instead of 64" in done.stderr
    row = done.stdout.splitlines()[1].split()
    assert row[0] == "65536" and row[-2] == "ok"                 # measured, payload verified


def test_a_run_that_cannot_fit_the_limit_says_what_it_needs():
    done = subprocess.run([*NOBODY, "bash", "-c", f"ulimit -l 8192 && exec {sys.executable} "
                           "-m gdrprobe run --loopback -s 8M"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 8, done.stderr
    assert "more than the locked-memory limit of 8.0 MiB" in done.stderr
    assert "raise the limit to at least" in done.stderr and "KiB" in done.stderr


def test_a_gpu_a_b_without_a_cuda_driver_answers_before_measuring(baseline):
    done = gdrprobe("run", "--loopback", "--mem", "gpu", "--staged", "--json")
    assert done.returncode == 9
    document = json.loads(done.stdout)           # no arm was measured: the error document
    assert (document["kind"], document["exit_code"]) == ("error", 9)
    assert "not testable: no CUDA driver (libcuda.so.1 could not be loaded)" in done.stderr
    assert "dlopen(libcuda.so.1)" in done.stderr and "fix:" in done.stderr
    assert rdma_resources() == baseline


def test_auto_falls_back_to_peermem_on_rxe_and_says_why(baseline):
    """Over the stand-in libcuda.so.1 the driver loads, so the GPU arm runs: rxe cannot
    register DMA-BUF (NCCL's probe answers EOPNOTSUPP), and gpu falls back to peermem."""
    pytest.importorskip("cuda.bindings", reason="needs cuda-python in the venv")
    done = gdrprobe("run", "--loopback", "--mem", "gpu", "--repeats", "1", "-n", "50", "--json",
                    env=over_standin(), timeout=600)
    assert done.stdout, done.stderr
    gpu = json.loads(done.stdout)["arms"][1]
    assert "auto fell back to peermem" in gpu["mechanism_reason"]
    assert "EOPNOTSUPP" in gpu["mechanism_reason"]
    assert rdma_resources() == baseline


def test_doctor_root_refuses_what_is_no_capture(tmp_path):
    done = gdrprobe("doctor", "--root", str(tmp_path / "nonexistent"))
    assert done.returncode == 2 and "does not exist" in done.stderr
    os.makedirs(tmp_path / "report")
    (tmp_path / "report" / "notes").write_text("")
    done = gdrprobe("capture", str(tmp_path / "report"))
    assert done.returncode == 2 and "is not empty" in done.stderr
