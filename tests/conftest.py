"""Time bounds by suite. pyproject.toml gives every test 120 s (pytest-timeout), which the
unit and binding tests keep. The lab's tests drive emulated guests and the GPU's tests a
device: one may run for minutes (a bench sweep with plots took 211 s in the lab), and each
suite has its own bound around it as well (lab/suites.py), so they get more.

How many processes `pytest -n auto` (pytest-xdist) spreads the unit tests over: ./dev unit
and tests/suite's child suites run that way; the lab's and the GPU's suites run in one process,
because their tests count the device's resources before and after."""

from __future__ import annotations

import os
import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
LONG_SUITES = (TESTS / "lab", TESTS / "gpu")
LONG_TEST_TIMEOUT_S = 900
# Two per core: half of the unit suite's wall time is spent waiting (on sockets, deadlines,
# child processes), not computing. Measured on 2 cores (./dev unit's pytest): one process
# 104 s, 2 workers 62 s, 4 workers 40 s.
XDIST_WORKERS_PER_CORE = 2


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(item.path)).resolve()
        if any(suite in path.parents for suite in LONG_SUITES):
            # A test's own @pytest.mark.timeout still wins: it is the closer marker.
            item.add_marker(pytest.mark.timeout(LONG_TEST_TIMEOUT_S), append=True)


@pytest.hookimpl(optionalhook=True)     # pytest-xdist's hook: no error where it is absent
def pytest_xdist_auto_num_workers(config):
    return XDIST_WORKERS_PER_CORE * len(os.sched_getaffinity(0))
