"""The command's entry points (the console script and ``python -m gdrprobe``) answer a
command module that fails to import as an internal error (exit 70, warn), never with
Python's exit 1, which a prolog reads as "drain the node"."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

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
