"""The unit suite itself: it ends on its own, and on a machine that lacks an optional
dependency it skips what needs it rather than failing.

Each check runs pytest in a child process set up as the awkward case: started with SIGINT
ignored (a background job, nohup), or with pyverbs or cuda-python missing.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
THIS_FILE = pathlib.Path(__file__).resolve()

# What the child of a background job or of nohup inherits; SIGALRM too, which a
# signal-based time-out would need.
IGNORED_AT_START = (signal.SIGINT, signal.SIGALRM)


def ignore_signals_at_start() -> None:
    for number in IGNORED_AT_START:
        signal.signal(number, signal.SIG_IGN)


def pytest_in_child(args: list[str], timeout_s: float, env: dict | None = None,
                    ignore_signals: bool = False) -> subprocess.CompletedProcess:
    """pytest over args from the repository's root (its pyproject.toml applies), bounded."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
        preexec_fn=ignore_signals_at_start if ignore_signals else None)


# ---- nothing hangs ------------------------------------------------------------------------
def test_the_loop_thread_tests_end_when_started_with_ctrl_c_ignored():
    started = time.monotonic()
    done = pytest_in_child(["tests/unit/test_loop_thread.py"], timeout_s=90,
                           ignore_signals=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 90


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


# ---- an optional dependency missing -------------------------------------------------------
def absent_package(tmp_path: pathlib.Path, name: str) -> dict:
    """An environment where `import name` fails, in this child and every process it starts
    (the unit tests run `python -m gdrprobe ...`): a package of that name first on the
    path that refuses to import, as the real one is absent."""
    stub = tmp_path / "absent" / name
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        f"raise ImportError('{name} is absent in this test run (test_suite_hygiene.py)')\n")
    path = os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def failures(done: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in done.stdout.splitlines()
                     if line.startswith(("FAILED", "ERROR"))) or done.stdout[-3000:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("package", ["pyverbs", "cuda"])
def test_the_unit_suite_skips_rather_than_fails_without(package, tmp_path):
    env = absent_package(tmp_path, package)
    done = pytest_in_child(["-rfE", "tests/unit", "--ignore", str(THIS_FILE)],
                           timeout_s=540, env=env)
    assert done.returncode == 0, failures(done)
