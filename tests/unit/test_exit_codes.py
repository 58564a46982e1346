"""One table of exit codes (gdrprobe/errors.py EXIT_CODES): the README's table, the prolog
recipe and `gdrprobe check --help` come from it; a bug in gdrprobe has its own code, which
never drains a node."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from gdrprobe import cli
from gdrprobe.errors import (DRAIN_CODES, EXIT_CODES, SCHEDULER_ACTION, ExitCode, GpuUnusable,
                             NoDevice, exit_codes_epilog, exit_codes_markdown)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_exit_code_has_one_row_and_one_of_three_actions():
    codes = [row.code for row in EXIT_CODES]
    assert sorted(codes) == sorted(ExitCode) and len(set(codes)) == len(codes)
    assert set(SCHEDULER_ACTION.values()) == {"start the job", "drain", "warn"}
    assert SCHEDULER_ACTION[ExitCode.OK] == "start the job"


def test_a_bug_and_the_check_itself_warn_a_gpu_every_job_would_crash_on_drains():
    assert SCHEDULER_ACTION[ExitCode.INTERNAL] == "warn"
    assert SCHEDULER_ACTION[ExitCode.GPU_UNUSABLE] == "drain"
    assert ExitCode.INTERNAL == 70        # sysexits.h EX_SOFTWARE
    assert GpuUnusable("x").exit_code in DRAIN_CODES


def test_the_readme_table_is_generated_from_the_one_table():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("| exit | meaning | prolog action |")
    table = readme[start:readme.index("\n\n", start)]
    assert table == exit_codes_markdown(), (
        "regenerate the README's table from gdrprobe.errors.exit_codes_markdown()")


def test_check_help_states_every_code_and_its_action():
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "check", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    assert " ".join(exit_codes_epilog().split()) in flat
    for code in ExitCode:
        assert re.search(rf"\b{int(code)}\b", exit_codes_epilog())


# ---- the command line's answer to what it did not expect --------------------------------


class Raising:
    """A parser whose one command's handler raises the given error."""

    def __init__(self, error: BaseException):
        self.error = error

    def parse_args(self, argv):
        def handler(args):
            raise self.error
        return type("Args", (), {"handler": staticmethod(handler)})()


@pytest.fixture
def command_raising(monkeypatch):
    """main()'s exit code for a command whose handler raises the given error."""
    def run(error: BaseException) -> int:
        monkeypatch.setattr(cli, "build_parser", lambda: Raising(error))
        return cli.main([])
    return run


def test_an_unexpected_exception_is_an_internal_error_not_a_drain(command_raising, capsys):
    code = command_raising(ValueError("226 is not a valid thing"))
    assert code == ExitCode.INTERNAL == 70 and SCHEDULER_ACTION[code] == "warn"
    message = capsys.readouterr().err
    assert message.startswith("gdrprobe: internal error: ValueError: 226 is not a valid thing")
    assert re.search(r"\n  at gdrprobe/cli/__init__\.py:\d+ in main\n", message)
    assert "bug in gdrprobe" in message and "not a fault of this node" in message
    assert "report" in message and "Traceback" not in message


def test_the_whole_traceback_is_there_when_asked_for(command_raising, capsys, monkeypatch):
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    command_raising(KeyError("slot"))
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_the_place_named_is_gdrprobes_own_code():
    try:
        from gdrprobe.rdma import verbs
        verbs.mtu_enum(7)
    except ValueError as error:
        assert re.fullmatch(r"gdrprobe/rdma/verbs\.py:\d+ in mtu_enum", cli.where(error))


def test_a_gdrprobe_error_keeps_its_own_code(command_raising, capsys):
    assert command_raising(NoDevice("no such device", "fix it")) == ExitCode.NO_DEVICE
    assert capsys.readouterr().err.startswith("gdrprobe: error: no such device")


def test_an_error_with_no_class_of_its_own_is_an_internal_error_not_a_drain(command_raising):
    from gdrprobe.errors import GdrprobeError

    assert command_raising(GdrprobeError("raised bare", "fix it")) == ExitCode.INTERNAL
