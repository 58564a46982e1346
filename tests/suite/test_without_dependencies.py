"""The unit suite on a machine that lacks an optional dependency: it skips what needs it
rather than failing. Each run is the whole unit suite in a child process, so this suite runs
once in ./dev test (and on its own: ./dev suites), not in every ./dev unit.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"

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
    """The unit suite (but this file) once per missing dependency, one run after the other,
    each spread over pytest-xdist's workers (-n auto: tests/conftest.py says how many). Both
    at once ran 8 workers on 2 cores and left the tests that time real threads short of a
    core. None: it did not end within its share of the time."""
    deadline = time.monotonic() + SUITE_WITHOUT_TIMEOUT_S
    return {package: suite_in_child(package, tmp_path_factory.mktemp(f"without-{package}"),
                                    deadline)
            for package in INSTALLS}


def suite_in_child(package: str, folder, deadline: float) -> subprocess.CompletedProcess | None:
    # Files, not pipes: the child never stalls on a full pipe. A session of its own: its
    # xdist workers, and whatever they start, end with it as one process group.
    with open(folder / "out", "w") as out, open(folder / "err", "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
             "-n", "auto", str(UNIT)],
            cwd=ROOT, env=without(package, folder), stdout=out, stderr=err,
            start_new_session=True)
    try:
        child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
    finally:    # past the deadline, or this run interrupted: the child does not outlive it
        if child.poll() is None:      # still running, so the group is still its own
            os.killpg(child.pid, signal.SIGKILL)
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
