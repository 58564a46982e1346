"""`gdrprobe nccl-log` on large and hostile logs: linear in the file on every path, and
bounded in memory whatever the log holds.

The logs are written by benchmarks/nccl_log_speed.py: a 60 MB job's log (many 8-GPU nodes,
every rank's set-up and channel lines, from NCCL 2.21's format strings), lines crafted to
cost a backtracking pattern the square of their length, a log naming a new host and NIC on
every line, and one that fills every bound of the reader with the longest names it keeps.
Each is read in a fresh process whose peak resident size is its own. Time is measured in
that benchmark, not here: these tests assert what was read, and the peak memory.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from gdrprobe.nccl import log as reader
from gdrprobe.nccl.log import read_nccl_log
from gdrprobe.report.nccl_log import OTHER_NIC, OTHERS

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARK = str(ROOT / "benchmarks" / "nccl_log_speed.py")
LOG_MB = 60
MAX_RSS_MIB = 200
# docs/doctor.md's bound on any log, whatever the output (measured worst: 132 MiB, with
# --lines --json; benchmarks/RESULTS.md).
MAX_HOSTILE_RSS_MIB = 160
CRAFTED_KINDS = 8            # the benchmark's CRAFTED lines
# Each of the children, inside the 120 s every unit test has (pyproject.toml): generous
# (each takes seconds); no timing is asserted.
TIME_LIMIT_S = 50


def write(path: pathlib.Path, kind: str, *args: str) -> pathlib.Path:
    subprocess.run([sys.executable, BENCHMARK, "--write", str(path), "--kind", kind, *args],
                   check=True, timeout=TIME_LIMIT_S)
    return path


def read_fresh(path: pathlib.Path, *args: str) -> dict:
    """What a fresh process read, and its peak (VmHWM: ru_maxrss would also count the
    parent's resident size at the fork, which Linux keeps across exec)."""
    out = subprocess.run([sys.executable, BENCHMARK, "--read", str(path), *args], capture_output=True,
                         text=True, check=True, timeout=TIME_LIMIT_S, cwd=ROOT).stdout
    return json.loads(out)


def test_a_60_mb_log_is_read_whole_in_bounded_memory(tmp_path):
    log = write(tmp_path / "nccl.log", "job", "--mb", str(LOG_MB))
    assert log.stat().st_size >= LOG_MB << 20
    text = log.read_bytes()
    lines, network = text.count(b"\n"), text.count(b" via NET/")
    result = read_fresh(log)
    assert result["rss_mib"] <= MAX_RSS_MIB
    assert (result["verdict"], result["channels"], result["lines_read"]) == ("gdr-all", 0, lines)
    assert result["network_channels"] == network      # nothing dropped on the way


def test_lines_crafted_against_backtracking_patterns_are_read_and_the_record_after_them_too(tmp_path):
    """Every crafted line ends with a real record (GDRDMA on n1): 60 KiB lines, read whole,
    and 1 MiB ones, read in pieces of 64 KiB and each counted once as cut. Before issue 30
    one 96 KB line took 20 s and four 1 MiB lines did not finish in 120 s."""
    for length, copies, cut in ((60 << 10, 4, 0), (1 << 20, 1, CRAFTED_KINDS)):
        log = write(tmp_path / f"crafted-{length}.log", "crafted", "--length", str(length),
                    "--copies", str(copies))
        report = read_nccl_log(str(log))
        n1 = [nic for nic in report.nics if nic.host == "n1"]
        assert (report.verdict, report.lines_read, report.cut_lines) == (
            "gdr-all", 1 + CRAFTED_KINDS * copies, cut)
        assert [(nic.index, nic.gdrdma_channels) for nic in n1] == [(0, CRAFTED_KINDS * copies)]


def test_a_line_over_the_cap_is_read_in_pieces_and_counted_once(tmp_path):
    record = "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA "
    log = tmp_path / "long.log"
    log.write_text(record * (3 * reader.MAX_LINE_BYTES // len(record)) + "\n" + record + "\n")
    report = read_nccl_log(str(log))
    assert (report.cut_lines, report.lines_read) == (1, 2)
    # At most one record lost or cut at each of the three edges between pieces.
    lost = 3 * reader.MAX_LINE_BYTES // len(record) + 1 - report.gdrdma_channels
    assert 0 <= lost <= 3 and report.unknown_channels <= lost
    assert any("longer than 64 KiB" in text for text in report.cannot_conclude)


def test_a_million_hosts_and_nics_are_summarised_in_bounded_memory(tmp_path):
    """Before issue 30, 10^6 lines naming distinct hosts and NICs peaked at 661-934 MiB."""
    log = write(tmp_path / "distinct.log", "distinct", "--rows", "300000")
    result = read_fresh(log, "--output", "json")
    assert result["rss_mib"] <= MAX_HOSTILE_RSS_MIB
    assert (result["verdict"], result["network_channels"], result["gdrdma_channels"]) == (
        "gdr-all", 300000, 300000)
    assert (result["hosts"], result["summarised"]) == (reader.MAX_HOSTS + 1, 1)


def test_every_bound_filled_with_the_longest_names_stays_under_the_stated_peak(tmp_path):
    log = write(tmp_path / "worst.log", "worst", "--rows", "12000")
    result = read_fresh(log, "--lines", "--output", "json")
    assert result["rss_mib"] <= MAX_HOSTILE_RSS_MIB
    assert (result["hosts"], result["nics"], result["pairs"], result["channels"]) == (
        reader.MAX_HOSTS + 1, reader.MAX_NICS + 1, reader.MAX_PAIRS, reader.MAX_LISTED_CHANNELS)
    assert result["network_channels"] == result["gdrdma_channels"] == 12000


def test_what_the_bounds_summarised_is_said_and_counted_together(monkeypatch):
    monkeypatch.setattr(reader, "MAX_HOSTS", 2)
    monkeypatch.setattr(reader, "MAX_NICS", 3)
    text = "n0:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n" + "".join(
        f"n{i}:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/{i}/GDRDMA x\n"
        for i in range(6))
    report = reader.parse_nccl_log(text)
    assert report.hosts == ("n0", "n1", OTHERS)
    assert [(nic.host, nic.transport, nic.index, nic.name, nic.gdrdma_channels) for nic in report.nics] == [
        (*OTHER_NIC, OTHERS, 3), (OTHERS, "IB", 2, None, 1), ("n0", "IB", 0, None, 1),
        ("n1", "IB", 1, None, 1)]
    assert report.gdrdma_channels == 6       # the counts stay exact
    assert report.summarised == (
        "the log names more than 3 NICs (by host, network and index): the records of NICs past "
        "the first 3 are counted together as NIC '(others)'",
        "the log names more than 2 hosts: the records of hosts past the first 2 are counted "
        "together under host '(others)'")
    assert set(report.summarised) <= set(report.cannot_conclude)
