"""Time bounds by suite. pyproject.toml gives every test 120 s (pytest-timeout), which the
unit and binding tests keep. The lab's tests drive emulated guests and the GPU's tests a
device: one may run for minutes (a bench sweep with plots took 211 s in the lab), and each
suite has its own bound around it as well (lab/suites.py), so they get more."""

from __future__ import annotations

import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
LONG_SUITES = (TESTS / "lab", TESTS / "gpu")
LONG_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(item.path)).resolve()
        if any(suite in path.parents for suite in LONG_SUITES):
            # A test's own @pytest.mark.timeout still wins: it is the closer marker.
            item.add_marker(pytest.mark.timeout(LONG_TEST_TIMEOUT_S), append=True)
