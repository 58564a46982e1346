"""The command's entry points (the console script and ``python -m gdrprobe``) answer a
command module that fails to import as an internal error (exit 70, warn), never with
Python's exit 1, which a prolog reads as "drain the node"."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from gdrprobe.errors import SCHEDULER_ACTION, ExitCode

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Importing one command module fails, as after a broken install or a bad edit.
BROKEN_COMMAND = """
import importlib.abc, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gdrprobe.cli.check":
            raise ImportError("gdrprobe.cli.check is broken here")
sys.meta_path.insert(0, Broken())
sys.argv = ["gdrprobe", "--version"]
"""


def console_script() -> tuple[str, str]:
    """(module, function) of the ``gdrprobe`` console script, as pyproject.toml names it."""
    text = (ROOT / "pyproject.toml").read_text()   # no tomllib before Python 3.11
    found = re.search(r'^\[project\.scripts\]\ngdrprobe = "([\w.]+):(\w+)"$', text, re.M)
    assert found, "pyproject.toml names no gdrprobe console script"
    return found.group(1), found.group(2)


def run_broken(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BROKEN_COMMAND + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def assert_internal_error(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == ExitCode.INTERNAL == 70, done.stderr
    assert SCHEDULER_ACTION[done.returncode] == "warn"
    assert done.stderr.startswith("gdrprobe: internal error: ImportError: gdrprobe.cli.check "
                                  "is broken here"), done.stderr
    assert "bug in gdrprobe" in done.stderr and "Traceback" not in done.stderr


def test_the_console_script_answers_a_broken_command_module_as_an_internal_error():
    module, function = console_script()
    assert_internal_error(run_broken(
        f"import importlib\nsys.exit(getattr(importlib.import_module({module!r}), "
        f"{function!r})())\n"))


def test_python_dash_m_answers_a_broken_command_module_as_an_internal_error():
    assert_internal_error(run_broken(
        "import runpy\nrunpy.run_module('gdrprobe', run_name='__main__', alter_sys=True)\n"))


def test_an_intact_install_still_answers():
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("gdrprobe "), done.stderr


# ---- a closed pipe and a terminating signal (issue 29) --------------------------------------


def gdrprobe_into_closed_pipe(*argv: str) -> subprocess.CompletedProcess:
    """`gdrprobe ARGV | true`: the reader is gone before gdrprobe writes."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run([sys.executable, "-m", "gdrprobe", *argv], cwd=ROOT,
                              stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(writer)


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["--version"],
                                  ["devices", "--json"], ["doctor"]],
                         ids=" ".join)
def test_output_into_a_closed_pipe_ends_quietly_with_141_never_as_a_bug(argv):
    """A Unix tool that SIGPIPE ends exits 128 + 13 in a shell and says nothing; gdrprobe
    said 'internal error ... a bug in gdrprobe' with exit 70 (issue 29)."""
    done = gdrprobe_into_closed_pipe(*argv)
    assert done.returncode == ExitCode.BROKEN_PIPE == 141, done.stderr
    assert SCHEDULER_ACTION[done.returncode] == "warn"
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    if argv[-1] in ("--help", "--version"):
        assert done.stderr == ""


def test_help_into_head_is_quiet():
    done = subprocess.run(["bash", "-c", f"{sys.executable} -m gdrprobe check --help | head -1;"
                           " echo \"status ${PIPESTATUS[0]}\""], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    first, status = done.stdout.splitlines()
    assert first.startswith("usage: gdrprobe check") and done.stderr == ""
    assert status in ("status 0", "status 141")    # head may read it all before it exits


def blocked_on_a_fifo(tmp_path) -> tuple[subprocess.Popen, int]:
    """gdrprobe nccl-log reading a FIFO that a writer holds open and never writes: a command
    waiting in a system call, as a check waits on the NIC."""
    fifo = tmp_path / "nccl.log"
    os.mkfifo(fifo)
    process = subprocess.Popen([sys.executable, "-m", "gdrprobe", "nccl-log", str(fifo)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 60
    while True:                  # opening for writing succeeds once gdrprobe has it open
        try:
            return process, os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise
            time.sleep(0.05)


@pytest.mark.parametrize("signum, code, said", [
    (signal.SIGTERM, ExitCode.TERMINATED, "terminated (SIGTERM)"),
    (signal.SIGINT, ExitCode.INTERRUPTED, "interrupted (Ctrl-C: SIGINT)")])
def test_a_signal_exits_128_plus_its_number_after_cleaning_up(tmp_path, signum, code, said):
    """SIGTERM is 143 and Ctrl-C 130, as a shell reports a command the signal ended, and as
    the README's table says; SIGTERM was 143 by the signal's default action (no clean-up)
    in some commands and 130 in others."""
    process, writer = blocked_on_a_fifo(tmp_path)     # main() has installed its handlers
    try:
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        os.close(writer)
    assert process.returncode == code == 128 + signum
    assert f"gdrprobe: {said}; everything was released" in stderr
    assert SCHEDULER_ACTION[code] == "warn"
