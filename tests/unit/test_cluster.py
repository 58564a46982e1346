"""The cluster check: which pairs meet in which round, what each pair's row says, the
matrix rank 0 prints, and the MPI choreography for real under mpirun (fake probes: no RDMA
here; the lab runs real ones)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from gdrprobe.errors import NoDevice
from gdrprobe.campaign import cluster
from gdrprobe.campaign.verdict import ArmMeasurement, classify
from gdrprobe.memory.cuda_driver import NO_DRIVER_FIX, unloadable_driver
from gdrprobe.report.check import ArmReport, CheckReport, Verdict
from gdrprobe.report.model import (ClusterPair, to_json)
from gdrprobe.report.text import render_cluster
from tests.unit.fakes.runs import run_report

REPO = pathlib.Path(__file__).resolve().parents[2]


def measured_arm(name: str, values, role: str) -> ArmReport:
    return ArmReport(name, "measured", 1 << 20, tuple(values), {}, {}, "", "", "", role=role)


def check_report(host: list[float], gpu: list[float], classification: str) -> CheckReport:
    """An A/B as ab_test builds it: the host arm, then the GPU arm that decides."""
    verdict = Verdict(classification, ratio=gpu[0] / host[0])
    return CheckReport(verdict, (measured_arm("host", host, ""), measured_arm("dmabuf", gpu, "decides")),
                       run_report(host[0]).settings, len(host))


# ---- pairs and rounds --------------------------------------------------------------


def test_all_pairs_meet_once_and_no_rank_is_busy_twice_in_a_round():
    for size in range(2, 9):
        pairs = cluster.pairs_of(size, "all")
        assert len(pairs) == size * (size - 1) // 2
        rounds = cluster.rounds_of(pairs)
        assert sorted(p for r in rounds for p in r) == sorted(pairs)
        for round_pairs in rounds:
            ranks = [rank for pair in round_pairs for rank in pair]
            assert len(ranks) == len(set(ranks))


def test_ring_pairs_each_rank_with_the_next():
    assert cluster.pairs_of(4, "ring") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert cluster.pairs_of(2, "ring") == [(0, 1)]
    assert cluster.rounds_of(cluster.pairs_of(4, "ring")) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]


@pytest.mark.parametrize("size, pattern", [(1, "all"), (4, "star")])
def test_impossible_plans_are_usage_errors(size, pattern):
    with pytest.raises(Exception) as raised:
        cluster.pairs_of(size, pattern)
    assert raised.value.exit_code == 2


# ---- rows and the report -----------------------------------------------------------


def test_pair_rows_from_a_run_an_a_b_and_an_error():
    host_only = cluster.pair_row(0, 1, "a", "b", run_report(90.0))
    assert (host_only.host_gbps, host_only.verdict, host_only.exit_code) == (90.0, None, 0)
    a_b = cluster.pair_row(0, 2, "a", "c", check_report([90, 92, 91], [45, 46, 44], "degraded"))
    assert (a_b.host_gbps, a_b.gpu_gbps, a_b.verdict, a_b.exit_code) == (91, 45, "degraded", 1)
    failed = cluster.pair_row(1, 2, "b", "c", NoDevice("no RDMA device found", "load rxe"))
    assert (failed.error, failed.fix, failed.exit_code) == ("no RDMA device found", "load rxe", 4)


def test_a_pair_row_reads_the_host_and_deciding_arms_by_what_they_are_not_their_place():
    a_b = check_report([90, 92, 91], [45, 46, 44], "degraded")
    staged = measured_arm("staged", (30.0,), "reference")
    diagnosing = measured_arm("dmabuf", (20.0,), "diagnoses")
    reordered = dataclasses.replace(a_b, arms=(staged, diagnosing) + a_b.arms[::-1])
    row = cluster.pair_row(0, 2, "a", "c", reordered)
    assert (row.host_gbps, row.gpu_gbps) == (91, 45)


def not_testable_check() -> CheckReport:
    """The A/B on a node without a CUDA driver, as ab_test builds it."""
    error = unloadable_driver(RuntimeError("Failed to dlopen libcuda.so.1"))
    host = ArmMeasurement("host", (90.0,), memory_kind="host", message_bytes=1 << 20)
    gpu = ArmMeasurement("gpu", not_testable=error.cause, fix=error.fix)
    arms = (ArmReport("host", "measured", 1 << 20, (90.0,), {}, {}, "", "", ""),
            ArmReport("gpu", "not testable", 1 << 20, (), {}, {}, "", error.cause, error.fix,
                      role="decides"))
    return CheckReport(classify(host, [gpu]), arms, run_report(90.0).settings, 1)


def test_a_not_testable_pair_says_why_and_how_to_fix_it_in_text_and_json():
    row = cluster.pair_row(0, 1, "a", "b", not_testable_check())
    cause = "not testable: no CUDA driver (libcuda.so.1 could not be loaded)"
    assert (row.verdict, row.likely_causes, row.fix, row.exit_code) == (
        "not testable", (cause,), NO_DRIVER_FIX, 9)
    report = cluster.cluster_report(2, "ring", [row], 0.8)
    text = render_cluster(report)
    assert (" GPUDirect RDMA per pair:\n"
            f"   0->1: {cause}\n"
            f"       fix: {NO_DRIVER_FIX}\n") in text   # "not testable" said once
    (pair,) = json.loads(to_json(report))["pairs"]
    assert (pair["verdict"], pair["likely_causes"], pair["fix"]) == (
        "not testable", [cause], NO_DRIVER_FIX)


class OneMeeting:
    """A communicator that hands the client rank one meeting and takes its "done"."""

    def __init__(self, meeting):
        self.meeting, self.sent = meeting, []

    def recv(self, source, tag):
        return self.meeting

    def send(self, message, dest, tag):
        self.sent.append(message)


def test_a_server_rank_that_cannot_serve_passes_its_fix_to_the_row():
    comm = OneMeeting(cluster.Meeting("10.0.0.1", 0, "", "b", error="no RDMA device found",
                                      fix="load rxe", exit_code=4))
    row = cluster.measure_pair(lambda meeting: pytest.fail("nothing to measure"), comm, 1, 0)
    assert comm.sent == ["done"]
    assert (row.error, row.fix, row.exit_code) == (
        "the server rank could not serve: no RDMA device found", "load rxe", 4)


def test_report_names_failed_not_engaged_and_slow_pairs():
    rows = [ClusterPair(0, 1, "a", "b", host_gbps=95.0),
            ClusterPair(0, 2, "a", "c", host_gbps=97.0, gpu_gbps=30.0, ratio=0.31,
                        verdict="not engaged", exit_code=1),
            ClusterPair(1, 2, "b", "c", host_gbps=40.0),
            ClusterPair(2, 3, "c", "d", error="the server went away",
                        fix="check that rank 3's node is up", exit_code=5),
            ClusterPair(0, 3, "a", "d", host_gbps=96.0)]
    report = cluster.cluster_report(4, "all", rows, 0.8)
    assert report.median_host_gbps == 95.5
    assert report.flagged == ("ranks 0->2: GPUDirect RDMA not engaged",
                              "ranks 1->2: slow, 40.000 Gb/s against a median of 95.500",
                              "ranks 2->3: the server went away")
    # A drain (the not engaged pair, the slow one) outweighs the peer error's warn (5).
    assert report.exit_code == 1
    text = render_cluster(report)
    assert " rank 1  -           -           40.00       -\n" in text
    assert " rank 2  -           -           -           failed\n" in text
    assert "failed" in text and "0->2: not engaged (GPU/host 0.31)" in text
    assert (" failed pairs:\n   2->3: the server went away\n"
            "       fix: check that rank 3's node is up\n") in text
    assert json.loads(to_json(report))["kind"] == "cluster"


def test_a_clean_matrix_exits_zero_and_a_slow_pair_alone_exits_one():
    fast = [ClusterPair(0, 1, "a", "b", host_gbps=90.0), ClusterPair(0, 2, "a", "c", host_gbps=91.0),
            ClusterPair(1, 2, "b", "c", host_gbps=92.0)]
    assert cluster.cluster_report(3, "all", fast, 0.8).exit_code == 0
    slow = fast[:2] + [ClusterPair(1, 2, "b", "c", host_gbps=10.0)]
    assert cluster.cluster_report(3, "all", slow, 0.8).exit_code == 1


def test_a_peer_error_never_hides_a_slow_pair():
    rows = [ClusterPair(0, 1, "a", "b", host_gbps=90.0), ClusterPair(0, 2, "a", "c", host_gbps=91.0),
            ClusterPair(1, 2, "b", "c", host_gbps=10.0),
            ClusterPair(2, 3, "c", "d", error="the server went away", exit_code=5)]
    assert cluster.cluster_report(4, "all", rows, 0.8).exit_code == 1
    only_warns = rows[:2] + rows[3:]
    assert cluster.cluster_report(4, "all", only_warns, 0.8).exit_code == 5


# ---- the MPI choreography, for real -------------------------------------------------


def mpirun(ranks: int, script: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    path = tmp_path / "ranks.py"
    path.write_text(script)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMPI_MCA_btl="self,tcp",
               OMPI_MCA_pml="ob1", OMPI_MCA_btl_tcp_if_include="lo")
    # Inside the test's 120 s: a hung mpirun is killed here, not left behind by pytest-timeout
    return subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                           sys.executable, str(path)], capture_output=True, text=True,
                          timeout=100, env=env, cwd=tmp_path)


def mpi_available() -> bool:
    if shutil.which("mpirun") is None:
        return False
    return subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True,
                          timeout=60).returncode == 0


needs_mpi = pytest.mark.skipif(not mpi_available(), reason="no mpirun or mpi4py here")

FAKE_RANKS = """
import json, threading
from gdrprobe.errors import PeerError
from gdrprobe.campaign import cluster
from tests.unit.fakes.runs import run_report
class FakeServer:
    port = 4242
    def __init__(self, token):
        self.token, self.closed = token, threading.Event()
    def serve(self):
        self.closed.wait()
    def close(self):
        self.closed.set()

def measure(meeting):
    assert meeting.port == 4242 and len(meeting.token) >= 16
    server = int(meeting.host.split(".")[-1])
    if server == 3:
        raise PeerError("rank 3 refused", "let rank 3 in")
    return run_report(10.0 * (server + 1))

comm = cluster.world()
rank = comm.Get_rank()
report = cluster.run_cluster(comm, "all", FakeServer, lambda: f"10.0.0.{rank}", measure)
if report is not None:
    print(json.dumps([[p.client_rank, p.server_rank, p.host_gbps, p.error, p.fix]
                      for p in report.pairs]))
"""


@needs_mpi
def test_every_pair_meets_through_mpi_and_rank_0_gathers_the_matrix(tmp_path):
    done = mpirun(4, FAKE_RANKS, tmp_path)
    assert done.returncode == 0, done.stderr
    # Open MPI may add notices of its own to stdout under load: take rank 0's one line.
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("[[")]
    rows = json.loads(line)
    refused = ["rank 3 refused", "let rank 3 in"]
    assert rows == [[0, 1, 20.0, "", ""], [0, 2, 30.0, "", ""], [0, 3, None, *refused],
                    [1, 2, 30.0, "", ""], [1, 3, None, *refused], [2, 3, None, *refused]]


@needs_mpi
def test_a_rank_that_cannot_take_part_stops_every_rank_with_its_reason(tmp_path):
    script = FAKE_RANKS.replace(
        'lambda: f"10.0.0.{rank}"',
        '(lambda: f"10.0.0.{rank}") if rank != 2 else '
        '(lambda: (_ for _ in ()).throw(__import__("gdrprobe.errors").errors.NoDevice("no RDMA device found")))')
    script = script.replace("report = cluster.run_cluster", "try:\n    report = cluster.run_cluster")
    # Each rank writes its own file: lines the ranks print can interleave on the way out.
    script = script.replace(
        "\nif report is not None:",
        "\nexcept Exception as error:\n"
        "    open(f'rank{rank}.txt', 'w').write("
        "f'rank {rank}: {type(error).__name__}: {error.cause}'); raise SystemExit(0)\n"
        "if report is not None:")
    done = mpirun(3, script, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = sorted((tmp_path / f"rank{rank}.txt").read_text() for rank in range(3))
    assert lines == ["rank 0: PeerError: other ranks cannot take part: rank 2: no RDMA device found",
                     "rank 1: PeerError: other ranks cannot take part: rank 2: no RDMA device found",
                     "rank 2: NoDevice: no RDMA device found"]


def test_without_mpi4py_the_cluster_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)     # import mpi4py now fails
    with pytest.raises(Exception) as raised:
        cluster.world()
    assert raised.value.exit_code == 3 and "python3-mpi4py" in raised.value.fix
