"""`gdrprobe check --gin` in the Soft-RoCE guest (issue 44): the whole step through real
libibverbs on rxe0, the stand-in libmlx5.so.1 preloaded (tests/mlx5_standin: it drives every
device, so rxe0 is opened as NCCL's GDAKI opens an mlx5 NIC, and it hands out the doorbell
page), and the registration through the real cuda.bindings over the stand-in libcuda.so.1
(GDRPROBE_STANDIN_IOMEMORY: the driver's two answers). It proves the control flow, both
answers and their exit codes, and that the guest holds no verbs object afterwards; not that
a driver maps a NIC's MMIO for a GPU (tests/gpu/test_gin_gpu.py, on a GPU beside an mlx5 NIC).
"""

import json

import pytest

from tests.lab.helpers import gdrprobe, over_standin, rdma_resources

pytest.importorskip("cuda.bindings", reason="needs cuda-python in the venv")


def check_gin(tmp_path, environ=None, **standin) -> tuple[int, dict]:
    from tests.mlx5_standin.build import build

    env = over_standin(**standin) | {"GDRPROBE_LOCK_DIR": str(tmp_path), "LD_PRELOAD": str(build())}
    env.pop("LOCAL_RANK", None)
    env.update(environ or {})
    done = gdrprobe("check", "--gin", "--json", "--time-budget", "120", "-s", "64K", "--repeats", "1",
                    env=env, timeout=600)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_mapped_doorbell_adds_nothing(tmp_path, baseline):
    code, report = check_gin(tmp_path)
    gin = report["gin"]
    assert (gin["outcome"], gin["nic"], gin["exit_code"]) == ("mapped", "rxe0", None), gin
    assert "rxe0's UAR page" in gin["doorbell"] and "non-cached dedicated" in gin["doorbell"]
    assert gin["calls"][0].endswith("CUDA_SUCCESS") and gin["calls"][-1].startswith("cuMemHostUnregister")
    assert code == report["verdict"]["exit_code"]
    assert rdma_resources() == baseline


def test_a_refused_doorbell_is_cpu_proxied_and_warns(tmp_path, baseline):
    code, report = check_gin(tmp_path, iomemory="refused")
    gin, verdict = report["gin"], report["verdict"]
    assert (gin["outcome"], gin["exit_code"]) == ("refused", 13), gin
    assert "CUDA_ERROR_OPERATING_SYSTEM" in gin["calls"][-1]
    assert gin["summary"].startswith("GIN will run CPU-proxied: the driver refused to map the NIC's MMIO")
    assert code == verdict["exit_code"] and code != 0
    if verdict["classification"] == "engaged" and not verdict["inconclusive"]:
        assert code == 13
    assert rdma_resources() == baseline


def test_a_job_that_asked_for_gin_drains(tmp_path, baseline):
    code, report = check_gin(tmp_path, {"NCCL_GIN_ENABLE": "1"}, iomemory="refused")
    assert report["gin"]["exit_code"] == 1 and code == 1
    assert "NCCL_GIN_ENABLE=1" in report["gin"]["summary"]
    assert rdma_resources() == baseline
