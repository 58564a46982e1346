"""`gdrprobe check` through real verbs over the stand-in libcuda.so.1 (tests/cuda_standin):
the gate's GPU arm with GPU memory at both ends, to a verdict.

In this Soft-RoCE guest the stand-in's "device memory" is host memory, so the peermem route
registers it on rxe: the NIC (rxe) reads one "GPU" buffer and writes another, integrity is
checked, and the verdict is a measured one. It proves the gate's plumbing (the arms, the
report, the floor not applied on a software device, the NIC named, the lock), not GPUDirect.
"""

import json

import pytest

from tests.lab.helpers import gdrprobe, over_standin, rdma_resources

pytest.importorskip("cuda.bindings", reason="needs cuda-python in the venv")


def check_over_standin(tmp_path, *args: str) -> tuple[int, dict, str]:
    env = over_standin() | {"GDRPROBE_LOCK_DIR": str(tmp_path)}
    env.pop("LOCAL_RANK", None)
    done = gdrprobe("check", "--time-budget", "120", "-s", "64K", *args, env=env, timeout=600)
    assert done.stdout, done.stderr
    return done.returncode, (json.loads(done.stdout) if "--json" in args else {}), done.stdout


def test_check_puts_gpu_memory_at_both_ends_and_reaches_a_verdict(tmp_path, baseline):
    code, report, _ = check_over_standin(tmp_path, "--repeats", "2", "--json")
    verdict = report["verdict"]
    # Host memory against host memory: either answer is possible; it must be a measured one.
    assert verdict["classification"] in ("engaged", "degraded"), verdict
    assert code == verdict["exit_code"]
    host, gpu, *directions = report["arms"]
    assert gpu["direction"] == "both" and gpu["outcome"] == "measured" and gpu["role"] == "decides"
    for side in ("local_memory", "remote_memory"):           # the NIC reads one, writes one
        assert gpu[side]["kind"] == "gpu" and gpu[side]["mechanism"] == "peermem", gpu[side]
        assert gpu[side]["pci_bus_id"] == "0000:3b:00.0"       # the stand-in's first "GPU"
    assert verdict["arms"][0]["direction"] == "both"
    if verdict["classification"] == "degraded":               # then each direction alone
        assert [arm["direction"] for arm in directions] == ["read", "write"]
        assert verdict["direction"] in ("read", "write", "both", "unknown")
    assert report["placement"]["nic"] == "rxe0"
    assert report["placement"]["lock"].startswith(f"{tmp_path}/rxe0.lock")
    floor = report["floor"]
    assert floor["software_device"] is True and floor["applied"] is False
    assert report["settings"]["qps"] == 2 and report["settings"]["cq_moderation"] == 1
    assert rdma_resources() == baseline


def test_the_screen_says_rxe_can_never_do_gpudirect_and_q_n_sets_the_qps(tmp_path):
    code, _, text = check_over_standin(tmp_path, "--repeats", "1", "-q", "1")
    assert "rxe0 is a software RDMA device (rxe, siw): the CPU copies every byte" in text
    assert " QPs 1 " in text and " NIC rxe0: " in text
    assert text.rstrip().endswith(("exit 0: start the job", "exit 1: drain", "exit 12: warn"))
    assert code in (0, 1, 12)


def test_a_gdr_level_no_path_reaches_holds_without_the_topology(tmp_path):
    """The guest's GPU is the stand-in's (no NVIDIA function in sysfs) and its NIC Soft-RoCE:
    NCCL's topology cannot be read, yet NCCL_NET_GDR_LEVEL=LOC keeps NCCL off GPUDirect
    whatever it is (issue 28: was engaged, exit 0)."""
    env = over_standin() | {"GDRPROBE_LOCK_DIR": str(tmp_path), "NCCL_NET_GDR_LEVEL": "LOC"}
    env.pop("LOCAL_RANK", None)
    done = gdrprobe("check", "--time-budget", "120", "-s", "64K", "--repeats", "1", "--json",
                    env=env, timeout=600)
    verdict = json.loads(done.stdout)["verdict"]
    assert verdict["nccl"]["settings"] == ["NCCL_NET_GDR_LEVEL=LOC (environment)"]
    assert verdict["nccl"]["firm"] and not verdict["nccl"]["node_fault"]
    # A measurement the A/B calls degraded stays a node's answer (check.md); any other is NCCL's.
    if verdict["classification"] == "degraded":
        assert verdict["exit_code"] == done.returncode and done.returncode in (1, 12)
    else:
        assert (verdict["classification"], verdict["exit_code"], done.returncode) == ("not used by NCCL", 10, 10)


def test_check_latency_and_read_answer_on_an_engaged_node_and_never_drain(tmp_path):
    """issue 31: --latency, --read and --bidir over real verbs (the stand-in's "GPU" memory is host
    memory on rxe: the plumbing, not GPUDirect): each answers, or says the WRITE A/B's
    answer comes first; a shortfall is exit 13, never a drain code."""
    from gdrprobe.errors import DRAIN_CODES, ExitCode

    code, report, _ = check_over_standin(tmp_path, "--repeats", "2", "--latency", "--read",
                                         "--bidir", "--json")
    verdict, latency, read = report["verdict"], report["latency"], report["read"]
    both_ways = report["bidir"]
    assert code == verdict["exit_code"]
    if verdict["classification"] != "engaged" or verdict["inconclusive"]:
        assert latency["outcome"] == read["outcome"] == both_ways["outcome"] == "not run"
        assert "comes first" in read["detail"]
        return
    assert latency["outcome"] in ("within bounds", "latency degraded", "inconclusive"), latency
    assert [r["size_bytes"] for r in latency["ratios"]] == [8, 4096]
    assert all(r["host_median_us"] > 0 and r["gpu_median_us"] > 0 for r in latency["ratios"])
    assert read["outcome"] in ("within bounds", "GDR read degraded", "inconclusive"), read
    assert read["verdict"]["arms"][0]["direction"] == "read"     # WRITEs out of GPU memory
    assert both_ways["outcome"] in ("within bounds", "GDR read degraded", "inconclusive")
    assert both_ways["arms"][1]["bidirectional"], both_ways["arms"][1]   # each direction
    warned = (latency["outcome"] == "latency degraded"
              or "GDR read degraded" in (read["outcome"], both_ways["outcome"]))
    assert code == (ExitCode.PERFORMANCE_WARNING if warned else ExitCode.OK)
    assert code not in DRAIN_CODES
