"""The probe across two hosts: host a (10.77.0.1) runs the client, host b the server."""

import signal
import sys
import time

import pytest

from gdrprobe.measure.loops import STALL_FLOOR_S
from tests.lab.helpers import client, gdrprobe, gdrprobe_json, rdma_resources, wait_for_run

HOST_B = "10.77.0.2"
TOKEN = "pair-token-0123456789"
SWEEP = [1 << k for k in range(1, 24)]


@pytest.fixture
def server_on_b(host_b):
    host_b.call("spawn", name="serve", argv=[
        sys.executable, "-m", "gdrprobe", "serve", "--bind", HOST_B, "--token", TOKEN,
        "--timeout", "5"])
    deadline = time.monotonic() + 60
    while "listening" not in host_b.call("wait", name="serve", timeout=0.5)["output"]:
        assert time.monotonic() < deadline, "server on host b did not start"
    yield host_b
    host_b.call("signal", name="serve", signal=signal.SIGINT)
    host_b.call("wait", name="serve", timeout=30)


def resources_on_b(host_b) -> dict:
    out = host_b.call("run", argv=["rdma", "resource", "show"], timeout=30)["output"]
    fields = out.split()
    return {key: int(fields[fields.index(key) + 1]) for key in ("qp", "cq", "pd", "mr")}


def test_full_sweep_host_to_host_with_integrity(server_on_b):
    report = gdrprobe_json("run", HOST_B, "--token", TOKEN, "-a", "-n", "3", timeout=900)
    assert [r["size_bytes"] for r in report["bandwidth"]] == SWEEP
    for row in report["bandwidth"]:
        assert row["integrity"]["checked"] and row["integrity"]["bad_bytes"] == 0, row
        assert row["integrity"]["stray_bytes"] == 0, row
    assert report["local"]["gid"].endswith("0a4d:0001")     # 10.77.0.1, chosen by address
    assert report["remote"]["gid"].endswith("0a4d:0002")
    assert report["remote"]["host"] != report["local"]["host"]


def test_latency_host_to_host(server_on_b):
    report = gdrprobe_json("run", HOST_B, "--token", TOKEN, "--latency", "-s", "8", "-n", "100")
    row = report["latency"][0]
    assert row["iterations"] == 100 and row["latency_us_min"] > 0
    assert row["integrity"]["bad_bytes"] == 0


def test_server_killed_mid_run_ends_the_client_with_a_peer_error(server_on_b):
    running = client(HOST_B, "--token", TOKEN, "-s", "65536", "-D", "60", "--timeout", "5")
    wait_for_run(qps=2)   # this host's QP (and the kernel's): the client is in its loop
    server_on_b.call("signal", name="serve", signal=signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = running.communicate(timeout=90)
    assert running.returncode == 5, stderr
    # The heartbeat or the QP says so, before the loop's stall time-out (STALL_FLOOR_S at least)
    assert time.monotonic() - killed < STALL_FLOOR_S, stderr
    assert rdma_resources_settle(lambda: resources_on_b(server_on_b))


def rdma_resources_settle(read, tries: int = 20) -> bool:
    """True once only the kernel's own QP/CQ/PD remain (a killed process's are reaped
    asynchronously)."""
    for _ in range(tries):
        if read() == {"qp": 1, "cq": 1, "pd": 1, "mr": 0}:
            return True
        time.sleep(0.5)
    return False


def test_client_killed_mid_run_leaves_the_server_serving(server_on_b):
    running = client(HOST_B, "--token", TOKEN, "-s", "65536", "-D", "60", "--timeout", "5")
    wait_for_run(qps=2)
    running.kill()
    running.wait(timeout=30)
    report = gdrprobe_json("run", HOST_B, "--token", TOKEN, "-s", "512", "-n", "10")
    assert report["bandwidth"][0]["integrity"]["bad_bytes"] == 0
    assert rdma_resources_settle(lambda: resources_on_b(server_on_b))
    assert rdma_resources_settle(rdma_resources)


def test_wrong_token_across_hosts(server_on_b):
    done = gdrprobe("run", HOST_B, "--token", "wrong-token-000-0123456789", "-n", "5",
                    timeout=120)
    assert done.returncode == 5 and "token" in done.stderr


def test_ncclS_pattern_against_a_server_that_takes_the_receivers_part(server_on_b):
    """--pattern nccl across the wire: the server on host b posts the clear-to-send and
    checks every step; the client's stream and NCCL pattern at NCCL's two step sizes."""
    report = gdrprobe_json("run", HOST_B, "--token", TOKEN, "--pattern", "nccl", "-n", "40",
                           timeout=600)
    sizes = [row["size_bytes"] for row in report["nccl"]]
    assert sizes == [131072, 524288] == [row["size_bytes"] for row in report["bandwidth"]]
    for row in report["nccl"]:
        integrity = row["integrity"]
        assert integrity["bad_bytes"] == 0 and integrity["stray_bytes"] == 0, row
        assert integrity["messages_checked"] == integrity["messages_total"] >= 40, row
        assert row["rate_gbps"] > 0 and row["alone"]["step_us"] > 0, row
    assert {answer["outcome"] for answer in report["nccl_answers"]} <= {
        "sustains", "round-trip bound", "below prediction"}
    assert report["settings"]["pattern"].startswith("nccl: 1 channel(s) x 1 QP(s)")
