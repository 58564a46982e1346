"""Another job's traffic on the port during `gdrprobe check` (issue 28), through real verbs
over the stand-in libcuda.so.1: a foreign `ib_write_bw` on rxe0 for the whole check makes
the answer inconclusive (exit 12), never degraded; alone on the port the counters see only
the check's own traffic. rxe keeps no octet counters; it counts its packets in
ports/1/hw_counters (sent_pkts, rcvd_pkts), which the check reads around each run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from gdrprobe.campaign.port_traffic import PACKETS, read_counts
from tests.lab.helpers import gdrprobe, over_standin, rdma_resources

pytest.importorskip("cuda.bindings", reason="needs cuda-python in the venv")
pytestmark = pytest.mark.skipif(
    not os.path.exists("/sys/class/infiniband/rxe0") or shutil.which("ib_write_bw") is None,
    reason="needs a lab guest with rxe0 and perftest")

PERFTEST_PORT = 18517
GIDS = "/sys/class/infiniband/rxe0/ports/1/gids"
LOOPBACK_V4 = "0000:0000:0000:0000:0000:ffff:7f00:0001"


def ipv4_gid_index() -> int:
    """The RoCE v2 GID of 127.0.0.1 on rxe0 (rxe0 sits on lo in the loopback guest)."""
    for index in sorted(int(name) for name in os.listdir(GIDS)):
        with open(f"{GIDS}/{index}") as gid:
            if gid.read().strip() != LOOPBACK_V4:
                continue
        with open(f"/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/{index}") as kind:
            if "v2" in kind.read():
                return index
    pytest.skip("rxe0 has no RoCE v2 GID for 127.0.0.1")


def check_json(tmp_path) -> tuple[int, dict]:
    env = over_standin() | {"GDRPROBE_LOCK_DIR": str(tmp_path)}
    env.pop("LOCAL_RANK", None)
    done = gdrprobe("check", "--time-budget", "120", "-s", "64K", "--repeats", "2", "--json",
                    env=env, timeout=600)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_rxe_counts_its_packets_where_the_check_reads_them():
    counts = read_counts("rxe0", 1)
    assert counts is not None and counts.unit == PACKETS, counts
    assert counts.source == "/sys/class/infiniband/rxe0/ports/1/hw_counters/{sent_pkts,rcvd_pkts}"


def test_alone_on_the_port_the_counters_see_only_the_checks_own_traffic(tmp_path):
    code, report = check_json(tmp_path)
    watched = report["placement"]["port_traffic"]
    assert watched.startswith("rxe0 port 1's counters read around each run: no other traffic"), \
        watched
    assert not any(line.startswith("another job's traffic")
                   for line in report["verdict"]["evidence"])
    assert code == report["verdict"]["exit_code"]
    print(watched)


@pytest.fixture
def foreign_traffic():
    """ib_write_bw server and client on rxe0, writing for the whole test (-D seconds)."""
    base = ["ib_write_bw", "-d", "rxe0", "-x", str(ipv4_gid_index()), "-p", str(PERFTEST_PORT),
            "-F", "-s", "65536", "-D", "400"]
    before = rdma_resources().get("qp", 0)
    server = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(2)
    client = subprocess.Popen([*base, "127.0.0.1"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while rdma_resources().get("qp", 0) < before + 2:      # both ends inside their loop
            assert client.poll() is None, client.communicate()[0]
            assert time.monotonic() < deadline, "ib_write_bw did not start"
            time.sleep(0.5)
        start = read_counts("rxe0", 1)
        time.sleep(2)
        assert read_counts("rxe0", 1).sent > start.sent, "ib_write_bw moved nothing"
        yield
    finally:
        for process in (client, server):
            process.kill()
            process.communicate(timeout=30)


def test_another_jobs_traffic_on_the_port_is_inconclusive_never_a_drain(tmp_path,
                                                                         foreign_traffic):
    code, report = check_json(tmp_path)
    verdict = report["verdict"]
    assert (code, verdict["exit_code"]) == (12, 12), verdict
    assert verdict["inconclusive"] and verdict["classification"] in ("engaged", "degraded")
    seen = [line for line in verdict["evidence"] if line.startswith("another job's traffic: run ")]
    assert seen and all(" on rxe0 port 1: the port sent " in line for line in seen), seen
    assert "other traffic in" in report["placement"]["port_traffic"]
    print(report["placement"]["port_traffic"], *seen, sep="\n")
