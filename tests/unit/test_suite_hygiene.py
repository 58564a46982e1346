"""The unit suite itself: it ends on its own, and on a machine that lacks an optional
dependency it skips what needs it rather than failing.

Each check runs pytest in a child process set up as the awkward case: started with SIGINT
ignored (a background job, nohup), or with pyverbs or cuda-python missing.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# What the child of a background job or of nohup inherits; SIGALRM too, which a
# signal-based time-out would need.
IGNORED_AT_START = (signal.SIGINT, signal.SIGALRM)


def ignore_signals_at_start() -> None:
    for number in IGNORED_AT_START:
        signal.signal(number, signal.SIG_IGN)


def pytest_in_child(args: list[str], timeout_s: float, env: dict | None = None,
                    ignore_signals: bool = False) -> subprocess.CompletedProcess:
    """pytest over args from the repository's root (its pyproject.toml applies); a child
    still running after timeout_s is killed and fails the test."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
            preexec_fn=ignore_signals_at_start if ignore_signals else None)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pytest {' '.join(args)} did not end within {timeout_s:g} s")


def summary(done: subprocess.CompletedProcess) -> str:
    """pytest's last line ("2 passed in 0.07s"): it printed one, so it ran to the end."""
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


# ---- nothing hangs ------------------------------------------------------------------------
def test_the_loop_thread_tests_end_when_started_with_ctrl_c_ignored():
    """Whether they pass is test_loop_thread.py's to say; here: they end, on their own."""
    done = pytest_in_child(["tests/unit/test_loop_thread.py"], timeout_s=90,
                           ignore_signals=True)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert " in " in summary(done) and "Timeout" not in done.stderr, done.stdout


def test_a_hanging_test_is_ended_by_the_configured_timeout_with_signals_ignored(tmp_path):
    hangs = tmp_path / "test_hangs.py"
    hangs.write_text(textwrap.dedent("""
        import threading

        def test_waits_forever():
            threading.Event().wait()
    """))
    # The project's own configuration (timeout_method from pyproject.toml), a short timeout.
    done = pytest_in_child(["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
                            "-o", "timeout=2", str(hangs)], timeout_s=60, ignore_signals=True)
    assert done.returncode != 0
    assert "Timeout" in done.stdout + done.stderr


def test_every_unit_test_has_a_time_limit():
    import pytest_timeout  # noqa: F401 - the plugin that enforces it is installed

    done = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert "timeout" in done.stdout
    config = (ROOT / "pyproject.toml").read_text()
    assert 'timeout_method = "thread"' in config and "\ntimeout = " in config


# ---- shared fakes have their own modules ---------------------------------------------------
def imported_test_modules(path: pathlib.Path) -> list[str]:
    """The test modules (test_*.py) a file imports: a fake two suites need belongs in a module
    of its own (tests/unit/fakes/, tests/lab/helpers.py), a fixture in a conftest.py."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found.extend(name for name in names if name.rsplit(".", 1)[-1].startswith("test_"))
    return found


def test_no_test_module_imports_another():
    offenders = {str(path.relative_to(ROOT)): names
                 for path in sorted((ROOT / "tests").rglob("*.py"))
                 if (names := imported_test_modules(path))}
    assert offenders == {}
