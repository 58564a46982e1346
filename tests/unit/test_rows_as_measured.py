"""`gdrprobe run` prints each size's row as it is measured, and a failure keeps the rows
measured before it (text on the terminal; a partial-run document with --json)."""

from __future__ import annotations

import json

import pytest

import gdrprobe
from gdrprobe.cli.run import run_rows_as_measured
from gdrprobe.errors import PeerError
from tests.unit.fakes.runs import run_report
def sweep(sizes_before_failure: int, printed: list[str], capsys, monkeypatch) -> dict:
    """gdrprobe.run measuring two sizes, checking what was printed before each next one;
    returns the arguments the command passes on."""
    report = run_report(1.5)

    def run(on_result, **arguments):
        for index in range(2):
            if index == sizes_before_failure:
                raise PeerError("the server went away during the run", "look at it")
            on_result(report.bandwidth[0])
            printed.append(capsys.readouterr().out)
        return report
    monkeypatch.setattr(gdrprobe, "run", run)
    return {"loopback": True}


def test_each_row_is_printed_as_soon_as_it_is_measured(capsys, monkeypatch):
    printed: list[str] = []
    report = run_rows_as_measured(sweep(2, printed, capsys, monkeypatch), False, True)
    assert report.kind == "run"
    first, second = printed
    assert first.splitlines()[0].split()[:2] == ["#bytes", "#iterations"]
    assert first.splitlines()[1].split()[:3] == ["4096", "10", "1.50"]
    assert second.split()[:3] == ["4096", "10", "1.50"]          # the row alone, no header
    assert "RDMA_Write BW Test" in capsys.readouterr().out        # the settings come last


def test_a_failure_keeps_the_rows_before_it_in_json(capsys, monkeypatch):
    printed: list[str] = []
    with pytest.raises(PeerError):
        run_rows_as_measured(sweep(1, printed, capsys, monkeypatch), True, False)
    assert printed == [""]                                        # --json: nothing mid-run
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "partial-run" and document["exit_code"] == 5
    assert [row["size_bytes"] for row in document["bandwidth"]] == [4096]
    assert document["error_cause"] == "the server went away during the run"


def test_a_failure_before_any_row_prints_nothing(capsys, monkeypatch):
    with pytest.raises(PeerError):
        run_rows_as_measured(sweep(0, [], capsys, monkeypatch), True, False)
    assert capsys.readouterr().out == ""


def test_a_bidirectional_run_hands_its_rows_with_the_servers(capsys, monkeypatch):
    """issue 31: a -b run's on_result gets this side's row and the server's of the same
    window (bench keeps both); run prints this side's as it comes."""
    report = run_report(1.5)

    def run(on_result, **arguments):
        on_result(report.bandwidth[0], report.bandwidth[0])
        return report
    monkeypatch.setattr(gdrprobe, "run", run)
    assert run_rows_as_measured({"loopback": True, "bidir": True}, False, True).kind == "run"
    assert "4096" in capsys.readouterr().out
