"""Run the binding suite (binding call shapes, not a GPU) under one or more Pythons.

    python -m tests.cuda_standin.run [PYTHON ...]

Each PYTHON (default: the one running this) must have cuda-python installed; the suite
runs in a child process whose LD_LIBRARY_PATH starts with the stand-in libcuda.so.1, so
the real cuda.bindings of that environment load it. Prints one line per environment and
exits non-zero if any run failed.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

from tests.cuda_standin.build import environment

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSION = ("import importlib.metadata as m\n"
           "for name in ('cuda-python', 'cuda-bindings'):\n"
           "    try: print(name, m.version(name)); break\n"
           "    except m.PackageNotFoundError: pass\n")
# Each test has pytest-timeout's bound (pyproject.toml); this one bounds a run that hangs
# outside a test (collection, a stand-in that deadlocks at load).
SUITE_TIMEOUT_S = 1800


def bindings_version(python: str) -> str:
    found = subprocess.run([python, "-c", VERSION], capture_output=True, text=True, timeout=60)
    return found.stdout.strip() or "no cuda-python"


def run_suite(python: str, extra: list[str]) -> int:
    env = environment()
    env["PYTHONPATH"] = ":".join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               str(ROOT / "tests" / "cuda_standin"), *extra]
    try:
        return subprocess.run(command, cwd=ROOT, env=env, timeout=SUITE_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"the binding suite under {python} did not end within {SUITE_TIMEOUT_S} s",
              flush=True)
        return 124


def main(argv: list[str]) -> int:
    pythons = [a for a in argv if not a.startswith("-")] or [sys.executable]
    extra = [a for a in argv if a.startswith("-")]
    outcomes = []
    for python in pythons:
        version = bindings_version(python)
        print(f"== binding call shapes, not a GPU: {version} ({python})", flush=True)
        outcomes.append((version, run_suite(python, extra)))
    for version, code in outcomes:
        print(f"binding suite over the stand-in driver, {version}: "
              f"{'passed' if code == 0 else f'FAILED (pytest exit {code})'}")
    return max(code for _, code in outcomes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
