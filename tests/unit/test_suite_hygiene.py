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


# ---- an optional dependency missing -------------------------------------------------------
# The top-level modules each dependency installs: the package, and for cuda-python the .pth
# hook that imports it at every start (which a machine without cuda-python does not run).
INSTALLS = {"pyverbs": ("pyverbs",), "cuda": ("cuda", "_cuda_bindings_redirector")}


def without(package: str, tmp_path: pathlib.Path) -> dict:
    """An environment where `import package` fails, in the child and every process it
    starts (unit tests run `python -m gdrprobe ...`): first on the path, a package of that
    name that raises what Python raises for one not installed, and empty stand-ins for the
    start-up hooks that would import it."""
    absent = tmp_path / "absent"
    name, *hooks = INSTALLS[package]
    (absent / name).mkdir(parents=True)
    # ModuleNotFoundError: also the only ImportError pytest.importorskip turns into a skip
    message = f"No module named {name!r} (absent in this run: test_suite_hygiene.py)"
    (absent / name / "__init__.py").write_text(
        f"raise ModuleNotFoundError({message!r}, name={name!r})\n")
    for hook in hooks:
        (absent / f"{hook}.py").write_text("")
    path = os.pathsep.join(filter(None, [str(absent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


SUITE_WITHOUT_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def suite_without(tmp_path_factory) -> dict[str, subprocess.CompletedProcess | None]:
    """The unit suite (but this file) once per missing dependency, one run after the other:
    side by side they loaded two cores enough to make the tests that wait on sockets and
    deadlines slow. None: it did not end within its share of the time."""
    deadline = time.monotonic() + SUITE_WITHOUT_TIMEOUT_S
    return {package: suite_in_child(package, tmp_path_factory.mktemp(f"without-{package}"),
                                    deadline)
            for package in INSTALLS}


def suite_in_child(package: str, folder, deadline: float) -> subprocess.CompletedProcess | None:
    # Files, not pipes: the child never stalls on a full pipe.
    with open(folder / "out", "w") as out, open(folder / "err", "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
             "tests/unit", "--ignore", str(THIS_FILE)],
            cwd=ROOT, env=without(package, folder), stdout=out, stderr=err)
    try:
        child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
    finally:    # past the deadline, or this run interrupted: the child does not outlive it
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode,
                                       (folder / "out").read_text(),
                                       (folder / "err").read_text())


def failures(done: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in done.stdout.splitlines()
                     if line.startswith(("FAILED", "ERROR"))) or done.stdout[-3000:]


@pytest.mark.timeout(SUITE_WITHOUT_TIMEOUT_S + 60)
@pytest.mark.parametrize("package", sorted(INSTALLS))
def test_the_unit_suite_skips_rather_than_fails_without(package, suite_without):
    done = suite_without[package]
    assert done is not None, f"did not end within {SUITE_WITHOUT_TIMEOUT_S} s"
    assert done.returncode == 0, failures(done)
    assert "Remainder of file ignored" not in done.stderr    # no start-up hook broke
