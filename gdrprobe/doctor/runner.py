"""Run every doctor check in the order of the diagnosis flowchart.

Each check module has ``check(ctx) -> list[Finding]``. A check that raises is a bug in
gdrprobe, not a fact about the machine, so it becomes a failing finding that says so
and the remaining checks still run.
"""

from __future__ import annotations

import importlib
import traceback
from typing import Mapping

from gdrprobe.doctor.context import DoctorContext
from gdrprobe.report.model import DoctorReport, Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

# (group, module) in flowchart order: placement, peer-memory stack, GPU, memlock, IOMMU, ACS,
# then the NCCL environment and the NIC ports.
CHECK_MODULES = (
    ("topology", "gdrprobe.doctor.topology"),
    ("stack", "gdrprobe.doctor.stack"),
    ("gpu", "gdrprobe.doctor.gpu"),
    ("memlock", "gdrprobe.doctor.memlock"),
    ("iommu", "gdrprobe.doctor.iommu"),
    ("acs", "gdrprobe.doctor.acs"),
    ("nccl", "gdrprobe.doctor.nccl_env"),
    ("nic", "gdrprobe.doctor.nic"),
)
GROUP_ORDER = tuple(group for group, _ in CHECK_MODULES) + ("access",)


def _crash_finding(group: str, module: str, error: BaseException) -> Finding:
    where = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    location = f" at {where[0].filename}:{where[0].lineno}" if where else ""
    return Finding(
        f"{group}.crashed", group, Status.FAIL,
        f"the {group} check crashed; this is a gdrprobe bug, not a finding about the machine",
        (Evidence(module, f"{type(error).__name__}: {error}{location}"),),
        "Report it with the output of `gdrprobe capture DIR` attached; the other checks still ran.")


def run_check(ctx: DoctorContext, group: str, module: str) -> list[Finding]:
    try:
        return list(importlib.import_module(module).check(ctx))
    except Exception as error:  # noqa: BLE001 - any crash must become a finding
        return [_crash_finding(group, module, error)]


def denied_finding(ctx: DoctorContext) -> list[Finding]:
    """Files that exist but this user may not read: an unknown, never an absence."""
    denied = sorted(ctx.root.denied)
    if not denied:
        return []
    return [Finding(
        "access.denied", "access", Status.SKIP,
        f"{len(denied)} file(s) exist but may not be read by this user: what they say is unknown, "
        "and the checks above that read them say so or skipped",
        tuple(Evidence(path, "permission denied") for path in denied),
        "Run the doctor as root (sudo gdrprobe doctor), or capture as root and replay anywhere.")]


def run_checks(ctx: DoctorContext) -> tuple[Finding, ...]:
    findings: list[Finding] = []
    for group, module in CHECK_MODULES:
        findings.extend(run_check(ctx, group, module))
    return tuple(findings + denied_finding(ctx))


def nccl_decisions(ctx: DoctorContext) -> tuple:
    """The per-GPU NCCL decisions for the report (the findings already say if computing them crashed)."""
    try:
        return ctx.nccl_decisions
    except Exception:  # noqa: BLE001 - reported as nccl.crashed by run_checks
        return ()


def run_doctor(root: str = "/", environ: Mapping[str, str] | None = None,
               sysroot: SysRoot | None = None) -> DoctorReport:
    ctx = DoctorContext(sysroot or SysRoot(root), environ)
    findings = run_checks(ctx)
    return DoctorReport(root=ctx.root.root, findings=findings, nccl=nccl_decisions(ctx))
