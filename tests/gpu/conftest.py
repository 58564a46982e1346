"""tests/gpu: checks for a machine with an NVIDIA GPU and driver (no RDMA NIC needed).

Run them with ``./dev gpu`` (sets up, then ``pytest -q -s tests/gpu``). Each test records
what the device reported with the ``facts`` fixture; the run ends with a short summary of
them (the cuda-python version first), to paste into the note of the session that ran it.
Elsewhere every test skips with the reason.
"""

from __future__ import annotations

import importlib.metadata

import pytest

FACTS: dict[str, str] = {}


def bindings_version() -> str:
    for name in ("cuda-python", "cuda-bindings"):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "no cuda-python"


@pytest.fixture
def facts() -> dict[str, str]:
    """Where a test records what the GPU told it, for the summary."""
    return FACTS


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    counts = ", ".join(f"{len(stats.get(k, []))} {k}" for k in ("passed", "failed", "skipped")
                       if stats.get(k))
    terminalreporter.section("gdrprobe GPU check")
    terminalreporter.write_line(f"bindings: {bindings_version()}")
    for name, value in FACTS.items():
        terminalreporter.write_line(f"{name}: {value}")
    terminalreporter.write_line(f"tests: {counts or 'none ran'}")
