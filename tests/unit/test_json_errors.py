"""Every --json path prints one JSON document, errors included (issue 29: `devices --json`
and `run --json` printed nothing on stdout when they ended in an error): the `error`
document of docs/json.md, with the exit code and what a scheduler does with it. The API is
replaced by functions that raise."""

from __future__ import annotations

import json

import pytest

import gdrprobe
from gdrprobe.cli import main
from gdrprobe.errors import NoDevice, PeerError, UsageError

RAISING = {
    "list_devices": NoDevice("no RDMA device found", "load the RDMA driver",
                             evidence="Failed to get devices list"),
    "diagnose": UsageError("--root /x does not exist", "give a capture"),
    "read_nccl_log": UsageError("nccl.log is empty", "give the job's log"),
    "bench": NoDevice("no RDMA device found", "load the RDMA driver"),
    "run": PeerError("cannot connect to 10.0.0.2:18750", "start gdrprobe serve there"),
}


@pytest.fixture
def failing(monkeypatch):
    for name, error in RAISING.items():
        def raise_it(*args, _error=error, **kwargs):
            raise _error
        monkeypatch.setattr(gdrprobe, name, raise_it)


def one_document(out: str) -> dict:
    return json.loads(out)            # one document: json.loads refuses two


@pytest.mark.parametrize("argv, code, action", [
    (["devices", "--json"], 4, "drain"),
    (["doctor", "--json"], 2, "warn"),
    (["nccl-log", "nccl.log", "--json"], 2, "warn"),
    (["bench", "--json"], 4, "drain"),
    (["run", "10.0.0.2", "--token", "t" * 40, "--json"], 5, "warn"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else str(value))
def test_an_error_prints_the_error_document(failing, capsys, argv, code, action):
    assert main(argv) == code
    out, err = capsys.readouterr()
    document = one_document(out)
    error = RAISING[{"devices": "list_devices", "doctor": "diagnose",
                     "nccl-log": "read_nccl_log"}.get(argv[0], argv[0])]
    assert document == {"schema_version": 1, "kind": "error", "command": argv[0],
                        "exit_code": code, "action": action, "error_cause": error.cause,
                        "error_evidence": error.evidence, "error_fix": error.fix}
    assert err.startswith(f"gdrprobe: error: {error.cause}")     # stderr as without --json


def test_a_bug_prints_the_error_document_with_the_internal_error(monkeypatch, capsys):
    def bug(*args, **kwargs):
        raise KeyError("slot")

    monkeypatch.setattr(gdrprobe, "list_devices", bug)
    assert main(["devices", "--json"]) == 70
    document = one_document(capsys.readouterr().out)
    assert (document["exit_code"], document["action"]) == (70, "warn")
    assert document["error_cause"] == "internal error: KeyError: 'slot'"
    assert document["error_evidence"].startswith("gdrprobe/") and "report it" in \
        document["error_fix"]


def test_a_flag_argparse_refuses_prints_the_error_document_too(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["devices", "--json", "--report_gbits"])
    document = one_document(capsys.readouterr().out)
    assert refused.value.code == 2 == document["exit_code"]
    assert document["command"] == "devices"
    assert document["error_cause"].startswith("unrecognized arguments: --report_gbits")


def test_without_json_nothing_goes_to_stdout(failing, capsys):
    assert main(["devices"]) == 4
    assert capsys.readouterr().out == ""


def test_a_run_that_failed_after_some_sizes_prints_its_partial_run_document_only(
        monkeypatch, capsys):
    from tests.unit.fakes.runs import run_report
    report = run_report(1.5)

    def run(on_result, **arguments):
        on_result(report.bandwidth[0])
        raise PeerError("the server went away during the run", "look at it")

    monkeypatch.setattr(gdrprobe, "run", run)
    assert main(["run", "--loopback", "--json"]) == 5
    document = one_document(capsys.readouterr().out)
    assert document["kind"] == "partial-run" and document["exit_code"] == 5


def test_the_error_document_is_what_docs_json_md_lists():
    import dataclasses
    import pathlib

    from gdrprobe.report.model import ErrorReport

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text()
    section = page.split("## error", 1)[1].split("\n## ", 1)[0]
    for field in dataclasses.fields(ErrorReport):
        assert f"`{field.name}`" in section
