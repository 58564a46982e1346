"""The binding suite: binding call shapes, not a GPU.

gdrprobe's CUDA code runs through the real cuda.bindings of this environment, which load
the stand-in libcuda.so.1 (standin.c) found first on LD_LIBRARY_PATH. Run it with
``python -m tests.cuda_standin.run [PYTHON ...]`` (``./dev bindings``), which builds the
stand-in and sets the path; run any other way, the suite skips and says how.
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.cuda_standin.build import LIBRARY, environment

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOW_TO_RUN = "run it through 'python -m tests.cuda_standin.run' (./dev bindings)"


def load_standin():
    """The stand-in as this process loaded it, or None (a real driver, or none at all)."""
    try:
        library = ctypes.CDLL(LIBRARY)
    except OSError:
        return None
    if not hasattr(library, "standin_reset"):
        return None
    library.standin_length.restype = ctypes.c_size_t
    library.standin_length.argtypes = [ctypes.c_ulonglong]
    library.standin_sync_memops.argtypes = [ctypes.c_ulonglong]
    library.standin_calls.restype = ctypes.c_long
    library.standin_calls_without_context.restype = ctypes.c_long
    library.standin_set_alloc_offset.argtypes = [ctypes.c_size_t]
    library.standin_vmm_gdr_capable.argtypes = [ctypes.c_ulonglong]
    library.standin_vmm_state.argtypes = [ctypes.c_ulonglong]
    library.standin_vmm_handle_types.argtypes = [ctypes.c_ulonglong]
    library.standin_iomemory_asked.restype = ctypes.c_long
    return library


STANDIN = load_standin()


def pytest_collection_modifyitems(config, items):
    if STANDIN is None:
        reason = f"needs the stand-in libcuda.so.1 on LD_LIBRARY_PATH: {HOW_TO_RUN}"
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


class Standin:
    """The stand-in's control functions, for one test."""

    def __init__(self, library):
        self.lib = library

    def fail(self, call: str, result: int, times: int = -1) -> None:
        """Make `call` return `result` (times: how often; -1 always)."""
        self.lib.standin_fail(call.encode(), int(result), times)

    def set_attribute(self, attribute: int, value: int) -> None:
        self.lib.standin_set_attribute(attribute, value)

    def __getattr__(self, name):
        return getattr(self.lib, "standin_" + name)

    def calls(self, call: str) -> int:
        return self.lib.standin_calls(call.encode())

    def last_export(self) -> tuple[int, int, int]:
        address, length, flags = ctypes.c_ulonglong(), ctypes.c_size_t(), ctypes.c_ulonglong()
        self.lib.standin_last_export(ctypes.byref(address), ctypes.byref(length),
                                     ctypes.byref(flags))
        return address.value, length.value, flags.value

    def assert_nothing_held(self) -> None:
        assert (self.live(-1), self.retained()) == (0, 0), "allocations or contexts left"


@pytest.fixture
def standin():
    STANDIN.standin_reset()
    yield Standin(STANDIN)
    # Every test: no call that needs a context was made without one current.
    without = STANDIN.standin_calls_without_context()
    STANDIN.standin_reset()
    assert without == 0, f"{without} driver calls were made with no context current"


def run_fresh(code: str, variant: str | None = "", before: str = "",
              base_env: dict | None = None):
    """Run `code` in a fresh interpreter over the stand-in `variant` (None: no stand-in;
    the driver is loaded once per process, so load-time behaviour needs its own process);
    `code` sets `outcome`, a JSON-able value printed back. `before` runs first."""
    env = (environment(variant, base_env) if variant is not None
           else dict(os.environ if base_env is None else base_env))
    env["PYTHONPATH"] = ":".join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    program = "\n".join([
        "import ctypes, json",
        before,
        "outcome = None",
        code,
        "print(json.dumps(outcome))",
    ])
    done = subprocess.run([sys.executable, "-c", program], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


CATCH_GDRPROBE_ERROR = """
from gdrprobe.errors import GdrprobeError
try:
    {call}
    outcome = "no error"
except GdrprobeError as error:
    outcome = dict(kind=type(error).__name__, cause=error.cause, fix=error.fix,
                   evidence=error.evidence, exit_code=int(error.exit_code))
"""


def error_of(call: str, **kwargs):
    """What gdrprobe raises for `call` in a fresh interpreter (see run_fresh)."""
    return run_fresh(CATCH_GDRPROBE_ERROR.format(call=call), **kwargs)


def real_driver_present() -> bool:
    """Whether a libcuda.so.1 other than the stand-in is loadable from the default path."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    probe = "import ctypes\ntry:\n ctypes.CDLL('libcuda.so.1'); print(1)\nexcept OSError: print(0)"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=60)
    return done.stdout.strip() == "1"
