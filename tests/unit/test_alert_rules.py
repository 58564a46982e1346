"""deploy/prometheus/gdrprobe-rules.yml's alerts hold the exit codes gdrprobe/errors.py gives
each action, and the warnings that persist alert from the check's and the prolog's metrics
(promtool runs the rules themselves: test_operations.py)."""

from __future__ import annotations

import pathlib
import re

import pytest

from gdrprobe.errors import CANNOT_CHECK_CODES, DRAIN_CODES, SCHEDULER_ACTION, WARN, ExitCode

RULES = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "gdrprobe-rules.yml"


def rule(name: str) -> dict:
    yaml = pytest.importorskip("yaml")
    [found] = [r for group in yaml.safe_load(RULES.read_text())["groups"]
               for r in group["rules"] if r["alert"] == name]
    return found


def codes_in(expression: str) -> set[int]:
    return {int(code) for code in re.findall(r"gdrprobe_check_exit_code == (\d+)", expression)}


def test_the_alerts_exit_codes_are_the_one_table_s():
    assert codes_in(rule("GdrprobeCheckDrains")["expr"]) == {int(c) for c in DRAIN_CODES}
    assert codes_in(rule("GdrprobeCheckCannotRun")["expr"]) == \
        {int(c) for c in CANNOT_CHECK_CODES}
    for name in ("GPUDirectRDMANotEngaged", "GdrprobeCheckDrains"):
        assert rule(name)["labels"]["severity"] == "critical" and rule(name)["for"]


@pytest.mark.parametrize("name, code", [("GdrprobeNotTestable", ExitCode.NOT_TESTABLE),
                                        ("GdrprobeInconclusive", ExitCode.INCONCLUSIVE),
                                        ("GdrprobePerformanceWarning",
                                         ExitCode.PERFORMANCE_WARNING)])
def test_a_warning_that_persists_alerts_from_the_check_and_the_prolog(name, code):
    """Hours of a warning (issue 41): the check's metrics and the prolog's alike; a
    warning, never a page, and only after a `for` longer than one check's schedule."""
    expression = rule(name)["expr"]
    assert codes_in(expression) == {int(code)}
    assert {int(c) for c in re.findall(r"gdrprobe_prolog_exit_code == (\d+)", expression)} == \
        {int(code)}
    assert SCHEDULER_ACTION[int(code)] == WARN
    assert rule(name)["labels"]["severity"] == "warning" and rule(name)["for"].endswith("h")


def test_the_prologs_gate_off_alerts():
    assert rule("GdrprobePrologGateOff")["expr"] == "gdrprobe_prolog_cannot_check == 1"
