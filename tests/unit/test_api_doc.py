"""docs/api.md's examples run as written (issue 41 item 5): each ```python block is executed.
A block whose first line says it runs anywhere runs in a fresh interpreter on this machine as
it is (no RDMA device, no GPU needed); every other block runs against the recorders of
tests/unit/fakes/engine.py, under the real public API and its real reports."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"
ANYWHERE = "# runs anywhere"
NCCL_LOG = ROOT / "tests" / "unit" / "fixtures" / "nccl_logs"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)


def test_the_page_has_examples_and_one_runs_anywhere():
    assert len(blocks()) >= 2
    assert any(block.startswith(ANYWHERE) for block in blocks())


def a_nccl_log(directory: pathlib.Path) -> None:
    """nccl.log in directory: a log of NCCL's own, from the suite's fixtures."""
    sample = sorted(NCCL_LOG.glob("*.log"))[0] if NCCL_LOG.is_dir() else None
    text = sample.read_text() if sample else "host:1:1 [0] NCCL INFO NCCL version 2.21.5\n"
    (directory / "nccl.log").write_text(text)


@pytest.mark.parametrize("index", [i for i, b in enumerate(blocks()) if b.startswith(ANYWHERE)])
def test_an_example_that_runs_anywhere_runs_here_as_written(tmp_path, index):
    a_nccl_log(tmp_path)
    done = subprocess.run([sys.executable, "-c", blocks()[index]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("index", [i for i, b in enumerate(blocks())
                                   if not b.startswith(ANYWHERE)])
def test_an_example_for_a_node_runs_against_the_engines_recorders(engine, monkeypatch,
                                                                  tmp_path, index):
    from tests.unit.fakes.engine import one_gpu_machine

    pytest.importorskip("pyverbs.device", reason="bench() names rdma-core's release through "
                        "pyverbs (Debian: python3-pyverbs)")
    one_gpu_machine(monkeypatch)
    monkeypatch.chdir(tmp_path)
    a_nccl_log(tmp_path)
    exec(compile(blocks()[index], f"docs/api.md block {index}", "exec"), {})  # noqa: S102
    assert engine, "the example reached no engine"
