"""Human output of a doctor report, and its exit code.

Findings are printed group by group in flowchart order, so the first failure printed
is the first thing to fix; a headline names it. Exit code: 0 when no finding failed,
1 (VERDICT_NOT_OK) when at least one did. Warnings, skips and infos do not change it.
"""

from __future__ import annotations

from gdrprobe.doctor.runner import GROUP_ORDER
from gdrprobe.errors import ExitCode
from gdrprobe.report import DoctorReport, Finding, Status

MARKS = {Status.OK: "[ OK ]", Status.WARN: "[WARN]", Status.FAIL: "[FAIL]",
         Status.SKIP: "[SKIP]", Status.INFO: "[INFO]"}
INDENT = " " * 7


def _group_rank(finding: Finding) -> int:
    return GROUP_ORDER.index(finding.group) if finding.group in GROUP_ORDER else len(GROUP_ORDER)


def ordered(report: DoctorReport) -> list[Finding]:
    """Findings in flowchart order; the sort is stable, so each check keeps its own order."""
    return sorted(report.findings, key=_group_rank)


def first_blocker(report: DoctorReport) -> Finding | None:
    return next((f for f in ordered(report) if f.status is Status.FAIL), None)


def exit_code(report: DoctorReport) -> int:
    failed = any(f.status is Status.FAIL for f in report.findings)
    return int(ExitCode.VERDICT_NOT_OK if failed else ExitCode.OK)


def headline(report: DoctorReport) -> str:
    blocker = first_blocker(report)
    if blocker is not None:
        return f"First blocker: {blocker.id}: {blocker.summary}"
    warnings = sum(f.status is Status.WARN for f in report.findings)
    return f"No blocking failure found ({warnings} warning(s))."


def _indented(label: str, text: str) -> list[str]:
    lines = text.splitlines() or [""]
    pad = INDENT + " " * (len(label) + 2)
    return [f"{INDENT}{label}: {lines[0]}"] + [pad + line for line in lines[1:]]


def render_finding(finding: Finding) -> list[str]:
    lines = [f"{MARKS[finding.status]} {finding.id}: {finding.summary}"]
    for evidence in finding.evidence:
        lines += _indented(evidence.source, evidence.value)
    if finding.fix:
        lines += _indented("fix", finding.fix)
    return lines


def render_text(report: DoctorReport) -> str:
    lines = [headline(report), f"(root: {report.root})"]
    group = None
    for finding in ordered(report):
        if finding.group != group:
            group = finding.group
            lines += ["", f"== {group} =="]
        lines += render_finding(finding)
    return "\n".join(lines) + "\n"
