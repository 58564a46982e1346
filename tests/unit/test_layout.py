"""The package's layering, checked: imports point down, and the doctor runs on a machine
where the native extension is not built (a capture replayed on a laptop)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.unit.doctor import machines

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gdrprobe"
LOWER_LAYERS = ("rdma", "memory", "protocol", "measure", "nccl", "report")
UPPER = ("gdrprobe.cli", "gdrprobe.doctor")


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reaching_up(path: pathlib.Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(name for name in imported_modules(path)
                  if any(name == top or name.startswith(top + ".") for top in forbidden))


@pytest.mark.parametrize("layer", LOWER_LAYERS)
def test_lower_layers_import_neither_cli_nor_doctor(layer):
    offenders = {str(path.relative_to(PACKAGE)): reaching_up(path, UPPER)
                 for path in sorted((PACKAGE / layer).glob("*.py"))}
    assert {path: names for path, names in offenders.items() if names} == {}


# What each layer must not import: the layers above it (README, "Layout"). memory and
# protocol both sit on rdma; memory borrows protocol's pure field validators only.
NOT_BELOW = {
    "rdma": ("gdrprobe.memory", "gdrprobe.protocol", "gdrprobe.measure", "gdrprobe.nccl"),
    "memory": ("gdrprobe.protocol.channel", "gdrprobe.protocol.messages", "gdrprobe.measure"),
    "protocol": ("gdrprobe.memory", "gdrprobe.measure"),
    "nccl": ("gdrprobe.rdma", "gdrprobe.memory", "gdrprobe.protocol", "gdrprobe.measure",
             "gdrprobe._native"),
    "report": ("gdrprobe.rdma", "gdrprobe.memory", "gdrprobe.protocol", "gdrprobe.measure",
               "gdrprobe.nccl", "gdrprobe._native"),
    "doctor": ("gdrprobe.cli", "gdrprobe.measure", "gdrprobe.protocol", "gdrprobe._native"),
}


@pytest.mark.parametrize("layer", sorted(NOT_BELOW))
def test_each_layer_imports_nothing_above_it(layer):
    offenders = {str(path.relative_to(PACKAGE)): reaching_up(path, NOT_BELOW[layer])
                 for path in sorted((PACKAGE / layer).glob("*.py"))}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_verdict_and_the_report_model_are_pure():
    heavy = ("gdrprobe._native", "gdrprobe.rdma", "gdrprobe.memory.cuda", "pyverbs", "cuda")
    for path in (PACKAGE / "campaign" / "verdict.py", PACKAGE / "report" / "model.py",
                 PACKAGE / "memory" / "spec.py", PACKAGE / "memory" / "causes.py"):
        assert reaching_up(path, heavy) == [], path


def test_options_open_no_device_and_no_memory():
    assert reaching_up(PACKAGE / "measure" / "options.py",
                       ("gdrprobe.memory.buffers", "gdrprobe.memory.gpu", "gdrprobe.memory.host",
                        "gdrprobe.memory.cuda", "gdrprobe.protocol.channel")) == []


# Imports of the native extension fail, as on a machine that never built it.
WITHOUT_NATIVE = """
import importlib.abc, sys
class NoNative(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gdrprobe._native":
            raise ImportError("gdrprobe._native is not built here")
sys.meta_path.insert(0, NoNative())
"""


def run_without_native(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_NATIVE + code],
                          capture_output=True, text=True)


def test_doctor_and_capture_replay_without_the_native_extension(tmp_path):
    machines.acs_node(tmp_path, pairs=1)
    done = run_without_native(
        "import sys, gdrprobe.doctor.runner, gdrprobe.doctor.capture\n"
        "from gdrprobe.cli import main\n"
        f"code = main(['doctor', '--root', {str(tmp_path)!r}])\n"
        "assert 'gdrprobe._native' not in sys.modules\n"
        "sys.exit(code)\n")
    assert done.returncode == 1, done.stderr        # the ACS finding fails, as it should
    assert "First blocker: acs.bridge" in done.stdout
    assert "Traceback" not in done.stderr
