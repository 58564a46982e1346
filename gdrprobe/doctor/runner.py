"""Run every doctor check in the order of the diagnosis flowchart.

Each check module has ``GROUP`` and ``check(ctx) -> list[Finding]``. A check that raises is
a bug in gdrprobe, not a fact about the machine, so it becomes a failing finding that says
so and the remaining checks still run.
"""

from __future__ import annotations

import traceback
from types import ModuleType
from collections.abc import Mapping

from gdrprobe.doctor.checks import acs, gin, gpu, iommu, memlock, nccl_env, nic, stack, topology
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import DoctorReport, Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

# Flowchart order: placement, peer-memory stack, GPU, memlock, IOMMU, ACS, then the NCCL
# environment and the NIC ports; last, GPU-initiated networking (GIN, IBGDA), which builds on
# all of them.
CHECKS: tuple[ModuleType, ...] = (topology, stack, gpu, memlock, iommu, acs, nccl_env, nic, gin)
GROUP_ORDER = tuple(check.GROUP for check in CHECKS) + (ids.ACCESS,)


def _crash_finding(check: ModuleType, error: BaseException) -> Finding:
    where = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    location = f" at {where[0].filename}:{where[0].lineno}" if where else ""
    group = check.GROUP
    return Finding(
        ids.crashed(group), group, Status.FAIL,
        f"the {group} check crashed; this is a gdrprobe bug, not a finding about the machine",
        (Evidence(check.__name__, f"{type(error).__name__}: {error}{location}"),),
        "Report it with the output of `gdrprobe capture DIR` attached; the other checks still ran.")


def run_check(ctx: DoctorContext, check: ModuleType) -> list[Finding]:
    try:
        return list(check.check(ctx))
    except Exception as error:  # noqa: BLE001 - any crash must become a finding
        return [_crash_finding(check, error)]


def denied_finding(ctx: DoctorContext) -> list[Finding]:
    """Files that exist but this user may not read: an unknown, never an absence."""
    denied = sorted(ctx.root.denied)
    if not denied:
        return []
    return [Finding(
        ids.ACCESS_DENIED, ids.ACCESS, Status.SKIP,
        f"{len(denied)} file(s) exist but may not be read by this user: what they say is unknown, "
        "and the checks above that read them say so or skipped",
        tuple(Evidence(path, "permission denied") for path in denied),
        "Run the doctor as root (sudo gdrprobe doctor), or capture as root and replay anywhere.")]


def run_checks(ctx: DoctorContext) -> tuple[Finding, ...]:
    """Every check's findings, in the flowchart's order; a replayed capture is checked by
    shape first (a damaged one is a DamagedCapture, exit 2, before any check runs)."""
    ctx.check_capture()
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(run_check(ctx, check))
    return tuple(findings + denied_finding(ctx))


def nccl_decisions(ctx: DoctorContext) -> tuple:
    """The per-GPU NCCL decisions for the report (the findings already say if computing them crashed)."""
    try:
        return ctx.nccl_decisions
    except Exception:  # noqa: BLE001 - reported as nccl.crashed by run_checks
        return ()


def nccl_library(ctx: DoctorContext):
    """The job's libnccl for the report (a crash finding the library is already nccl.crashed)."""
    try:
        return ctx.nccl_library
    except Exception:  # noqa: BLE001 - reported as nccl.crashed by run_checks
        return None


def run_doctor(root: str = "/", environ: Mapping[str, str] | None = None,
               sysroot: SysRoot | None = None, nccl: str | None = None) -> DoctorReport:
    """``nccl``: the job's libnccl or its Python (:mod:`gdrprobe.doctor.facts.nccl_library`)."""
    ctx = DoctorContext(sysroot or SysRoot(root), environ, nccl)
    findings = run_checks(ctx)
    return DoctorReport(root=ctx.root.root, findings=findings, nccl=nccl_decisions(ctx),
                        nccl_library=nccl_library(ctx))
