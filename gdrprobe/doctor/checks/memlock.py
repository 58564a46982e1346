"""Can an RDMA job pin the memory it registers? RLIMIT_MEMLOCK and CAP_IPC_LOCK.

Registering host memory, and creating queue pairs and completion queues, pins pages that
the kernel charges to RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK. A low limit
shows up as "ibv_reg_mr failed" or "ibv_create_qp failed" (NCCL prints both). What a job
needs is not what gdrprobe pins (:mod:`gdrprobe.doctor.checks.probe_needs`): NCCL's
troubleshooting guide and the NIC vendors ask for ``memlock unlimited``, so a finite limit
warns, and one below the least `gdrprobe check` runs with (8 MiB: one integrity slot a
side, the queues; the kernel's default since 5.16) fails, as the check itself refuses to
start there (campaign/memlock.py). The doctor is often run as root (the ACS check needs it), and root holds
CAP_IPC_LOCK, so what a non-root job gets is read too: pam_limits (limits.conf and
limits.d, in KiB; ``*`` does not cover root), systemd's DefaultLimitMEMLOCK, else the
kernel's default (64 KiB before Linux 5.16, 8 MiB since). In a container the container's
limit is the doctor's own. The fix depends on where the process runs and, in a container,
on whether it runs as root: a capability the container adds reaches only a root process.
"""

from __future__ import annotations

import functools
import re

from gdrprobe.doctor.checks.probe_needs import (CHECK_MEMLOCK_BYTES, PROBE_MEMLOCK_BYTES, MiB,
                                                format_mib)
from gdrprobe.doctor.facts.container import Container
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.memory_path import KERNEL_RELEASE_FILE, kernel_version
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.numbers import decimal
from gdrprobe.sysroot import SysRoot

GROUP = ids.MEMLOCK
finding = functools.partial(Finding, group=GROUP)

LIMITS_FILE = "/proc/self/limits"
PAM_LIMITS_FILE = "/etc/security/limits.conf"
PAM_LIMITS_DIR = "/etc/security/limits.d"
SYSTEMD_CONF = "/etc/systemd/system.conf"
SYSTEMD_CONF_DIR = "/etc/systemd/system.conf.d"
UNLIMITED = float("inf")
# Linux 5.16 raised the default RLIMIT_MEMLOCK from 64 KiB to 8 MiB (MLOCK_LIMIT).
KERNEL_DEFAULT_MEMLOCK = (((5, 16), 8 * 1024 * 1024), ((0, 0), 64 * 1024))
STATUS_FILE = "/proc/self/status"
CAP_IPC_LOCK_BIT = 14
HEX_MASK = re.compile(r"[0-9a-fA-F]{1,16}")      # a capability set, as /proc/PID/status writes it

# A capability a container adds reaches a process running as root in it; a non-root process
# gets it only through the ambient set (capabilities(7): execve), which Kubernetes never sets
# (kubernetes/kubernetes#56374, open; containerd/containerd#5668, closed unmerged): in a
# non-root pod only the memlock limit itself can rise, and Kubernetes has no field for it.
KUBERNETES_ROOT_FIX = ('Add the capability to the container: securityContext.capabilities.add: ["IPC_LOCK"] '
                       "(for a process running as root in it the memlock limit then no longer applies to RDMA "
                       "registrations).")
KUBERNETES_NON_ROOT_FIX = (
    "Raise the memlock limit the container runtime gives its containers: a non-root container's process gets "
    "nothing from securityContext.capabilities.add (Kubernetes sets no ambient capabilities, "
    "kubernetes/kubernetes#56374), so IPC_LOCK does not lift the limit, and the pod spec has no field for it. "
    "containerd: LimitMEMLOCK=infinity in a systemd drop-in for containerd.service (its containers inherit it "
    "unless its base runtime spec sets RLIMIT_MEMLOCK); CRI-O: default_ulimits = [\"memlock=-1:-1\"] in "
    "crio.conf; then restart the runtime and the pod.")
DOCKER_FIX = ("Run the container with `--ulimit memlock=-1:-1` (`--cap-add IPC_LOCK` lifts the limit only for a "
              "process running as root in the container).")
HOST_FIX = ("Set `* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.conf, "
            "then log in again (or set the Slurm/systemd launch limits); check with `ulimit -l`.")


# ---- facts ------------------------------------------------------------------


def memlock_limits(root: SysRoot) -> tuple[str, str] | None:
    """(soft, hard) of "Max locked memory" as written: a number of bytes or "unlimited"."""
    for line in (root.read(LIMITS_FILE) or "").splitlines():
        match = re.match(r"Max locked memory\s+([0-9]+|unlimited)\s+([0-9]+|unlimited)\s", line + " ")
        if match:
            return match.group(1), match.group(2)
    return None


def limit_bytes(value: str) -> float:
    return UNLIMITED if value == "unlimited" else decimal(value)


def effective_capabilities(root: SysRoot) -> int | None:
    for line in (root.read(STATUS_FILE) or "").splitlines():
        if line.startswith("CapEff:"):
            fields = line.split()
            return int(fields[1], 16) if len(fields) > 1 and HEX_MASK.fullmatch(fields[1]) else None
    return None


def pinned_bytes_now(root: SysRoot) -> int:
    """What this process has pinned already (VmPin), charged to the same limit."""
    for line in (root.read(STATUS_FILE) or "").splitlines():
        if line.startswith("VmPin:"):
            fields = line.split()
            return (decimal(fields[1]) or 0) * 1024 if len(fields) > 1 else 0   # kB, as /proc writes it
    return 0


def has_ipc_lock(cap_eff: int) -> bool:
    return bool(cap_eff >> CAP_IPC_LOCK_BIT & 1)


def status_field(root: SysRoot, name: str) -> list[str] | None:
    """The values of a /proc/self/status line ("Uid", "CapBnd"), or None."""
    for line in (root.read(STATUS_FILE) or "").splitlines():
        if line.startswith(name + ":"):
            return line.split()[1:]
    return None


def runs_as_root(root: SysRoot) -> bool | None:
    """Whether this process's effective user is root (Uid's second field); None: unknown."""
    uid = status_field(root, "Uid")
    return uid[1] == "0" if uid and len(uid) > 1 else None


def memlock_fix(container: Container, as_root: bool | None = None) -> str:
    """Where the limit can rise for a process running as root or not (None: unknown, a job's)."""
    if container.kind == "kubernetes":
        if as_root is None:
            return f"If the job runs as root in the container: {KUBERNETES_ROOT_FIX} If not: {KUBERNETES_NON_ROOT_FIX}"
        return KUBERNETES_ROOT_FIX if as_root else KUBERNETES_NON_ROOT_FIX
    if container.kind is not None:
        return DOCKER_FIX
    return HOST_FIX


# ---- findings ---------------------------------------------------------------


def container_finding(container: Container) -> Finding:
    return finding(
        id=ids.MEMLOCK_CONTAINER,
        status=Status.INFO,
        summary=f"running in a {container.kind} container" if container.kind else "not running in a container",
        evidence=container.evidence or (Evidence("/.dockerenv, /proc/1/cgroup, KUBERNETES_SERVICE_HOST", "none"),),
    )


def capability_finding(root: SysRoot, cap_eff: int | None) -> Finding:
    if cap_eff is None:
        return finding(id=ids.MEMLOCK_CAP_IPC_LOCK, status=Status.SKIP,
                       summary="effective capabilities could not be read",
                       evidence=(Evidence(STATUS_FILE + " CapEff", "absent"),))
    held = has_ipc_lock(cap_eff)
    evidence = (Evidence(STATUS_FILE + " CapEff", f"{cap_eff:016x}"),)
    bounding, as_root = status_field(root, "CapBnd"), runs_as_root(root)
    if not held and bounding and has_ipc_lock(int(bounding[0], 16)) and as_root is False:
        uid = status_field(root, "Uid")[1]
        return finding(id=ids.MEMLOCK_CAP_IPC_LOCK, status=Status.INFO,
                       summary="CAP_IPC_LOCK is in the bounding set but not the effective set: a capability the "
                               "container adds never reaches a process running as a non-root user",
                       evidence=evidence + (Evidence(STATUS_FILE + " CapBnd", bounding[0]),
                                            Evidence(STATUS_FILE + " Uid", f"{uid} (not root)")))
    return finding(id=ids.MEMLOCK_CAP_IPC_LOCK, status=Status.INFO,
                   summary=f"CAP_IPC_LOCK is {'in' if held else 'not in'} the effective set", evidence=evidence)


def limit_finding(limits: tuple[str, str] | None, cap_eff: int | None, container: Container,
                  as_root: bool | None = None) -> Finding:
    """This process's own limit, judged against what an RDMA job needs (unlimited); as_root:
    whether it runs as root (the fix in a container depends on it)."""
    if limits is None:
        return finding(id=ids.MEMLOCK_LIMIT, status=Status.SKIP, summary="RLIMIT_MEMLOCK could not be read",
                       evidence=(Evidence(LIMITS_FILE, "no 'Max locked memory' line"),))
    soft, hard = limits
    evidence = (Evidence(LIMITS_FILE + " Max locked memory", f"soft {soft}, hard {hard}"),)
    need = f"{format_mib(CHECK_MEMLOCK_BYTES)} gdrprobe check pins at least"
    if cap_eff is not None and has_ipc_lock(cap_eff):
        return finding(id=ids.MEMLOCK_LIMIT, status=Status.OK,
                       summary=f"memlock soft limit {soft}, but this process holds CAP_IPC_LOCK, which lifts it "
                               "(a process without it gets the limit: see memlock.jobs)",
                       evidence=evidence)
    if limit_bytes(soft) == UNLIMITED:
        return finding(id=ids.MEMLOCK_LIMIT, status=Status.OK,
                       summary="memlock soft limit is unlimited, as RDMA jobs need", evidence=evidence)
    if limit_bytes(soft) >= CHECK_MEMLOCK_BYTES:
        return finding(id=ids.MEMLOCK_LIMIT, status=Status.WARN,
                       summary=f"memlock soft limit {soft} covers the {need} ({sweep_need()}), but "
                               "not an RDMA job: NCCL's troubleshooting guide and the NIC vendors ask "
                               "for unlimited",
                       evidence=evidence, fix=memlock_fix(container, as_root))
    if limit_bytes(hard) >= CHECK_MEMLOCK_BYTES:
        return finding(id=ids.MEMLOCK_LIMIT, status=Status.WARN,
                       summary=f"memlock soft limit {soft} is below the {need}; "
                               "the hard limit allows it",
                       evidence=evidence,
                       fix=f"Raise the soft limit in the launching shell (`ulimit -l {hard}`); to make it stick: "
                           + memlock_fix(container, as_root))
    return finding(id=ids.MEMLOCK_LIMIT, status=Status.FAIL,
                   summary=f"memlock limit (soft {soft}, hard {hard}) is below the {need} and "
                           "CAP_IPC_LOCK is not held: ibv_reg_mr and ibv_create_qp will fail",
                   evidence=evidence, fix=memlock_fix(container, as_root))


def sweep_need() -> str:
    """What a whole `gdrprobe bench` sweep pins: more than the check, which a limit between
    the two serves with fewer integrity slots."""
    return f"a full bench sweep pins {format_mib(PROBE_MEMLOCK_BYTES)}"


# ---- what a job without CAP_IPC_LOCK gets -------------------------------------------


def pam_value(text: str) -> float | None:
    """A limits.conf memlock value in bytes (the file counts KiB)."""
    if text in ("unlimited", "infinity", "-1"):
        return UNLIMITED
    number = decimal(text)
    return None if number is None else number * 1024


def systemd_value(text: str) -> float | None:
    """One side of DefaultLimitMEMLOCK= in bytes: infinity, or a number with K/M/G/T (1024-based)."""
    match = re.fullmatch(r"([0-9]+)\s*([KMGT]?)B?", text.strip(), re.IGNORECASE)
    if text.strip() == "infinity":
        return UNLIMITED
    if not match:
        return None
    return decimal(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " ")


def pam_memlock(root: SysRoot) -> tuple[float | None, float | None, list[Evidence]]:
    """(soft, hard) that pam_limits gives every non-root user ("*" lines), in file order."""
    soft = hard = None
    evidence = []
    files = [PAM_LIMITS_FILE] + [f"{PAM_LIMITS_DIR}/{name}" for name in root.listdir(PAM_LIMITS_DIR)
                                 if name.endswith(".conf")]
    for path in files:
        for line in (root.read(path) or "").splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) != 4 or fields[2] != "memlock" or fields[0] != "*":
                continue
            value = pam_value(fields[3])
            if value is None:
                continue
            evidence.append(Evidence(path, " ".join(fields)))
            soft = value if fields[1] in ("soft", "-") else soft
            hard = value if fields[1] in ("hard", "-") else hard
    return soft, hard, evidence


def systemd_memlock(root: SysRoot) -> tuple[float | None, list[Evidence]]:
    """systemd's DefaultLimitMEMLOCK= soft value (services and user sessions inherit it)."""
    soft, evidence = None, []
    files = [SYSTEMD_CONF] + [f"{SYSTEMD_CONF_DIR}/{name}" for name in root.listdir(SYSTEMD_CONF_DIR)
                              if name.endswith(".conf")]
    for path in files:
        for line in (root.read(path) or "").splitlines():
            if line.strip().startswith("DefaultLimitMEMLOCK="):
                value = systemd_value(line.split("=", 1)[1].split(":")[0])
                if value is not None:
                    soft = value
                    evidence.append(Evidence(path, line.strip()))
    return soft, evidence


def kernel_default(release: str | None) -> tuple[float, Evidence]:
    release = release or ""
    version = kernel_version(release) or (0, 0)
    value = next(size for floor, size in KERNEL_DEFAULT_MEMLOCK if version >= floor)
    return value, Evidence(KERNEL_RELEASE_FILE, f"{release or 'unknown'}: kernel default {format_bytes(value)}")


def format_bytes(value: float) -> str:
    if value == UNLIMITED:
        return "unlimited"
    return format_mib(int(value)) if value >= MiB else f"{int(value) // 1024} KiB"


def job_limit(ctx: DoctorContext, container: Container,
              own: tuple[str, str] | None) -> tuple[float | None, str, tuple[Evidence, ...]]:
    """(soft limit a non-root job gets, where it comes from, evidence)."""
    if container.kind is not None:
        soft = limit_bytes(own[0]) if own else None
        return soft, "this container's limit", (Evidence(LIMITS_FILE, f"soft {own[0] if own else '?'}"),)
    pam_soft, _pam_hard, pam_evidence = pam_memlock(ctx.root)
    systemd_soft, systemd_evidence = systemd_memlock(ctx.root)
    if pam_soft is not None:
        return pam_soft, "pam_limits (a login: ssh, su, a batch system using PAM)", tuple(pam_evidence)
    if systemd_soft is not None:
        return systemd_soft, "systemd's DefaultLimitMEMLOCK (no memlock line in limits.conf)", tuple(systemd_evidence)
    value, evidence = kernel_default(ctx.kernel_release)
    return value, "the kernel's default (neither limits.conf nor systemd sets memlock)", (
        Evidence(PAM_LIMITS_FILE, "no '*' memlock line"), Evidence(SYSTEMD_CONF, "no DefaultLimitMEMLOCK"), evidence)


def job_finding(ctx: DoctorContext, container: Container, own: tuple[str, str] | None) -> Finding:
    soft, source, evidence = job_limit(ctx, container, own)
    need = format_mib(CHECK_MEMLOCK_BYTES)
    if soft is None:
        return finding(id=ids.MEMLOCK_JOBS, status=Status.SKIP,
                       summary="the memlock limit of a job without CAP_IPC_LOCK could not be read", evidence=evidence)
    got = f"a job without CAP_IPC_LOCK gets memlock {format_bytes(soft)} from {source}"
    if soft == UNLIMITED:
        return finding(id=ids.MEMLOCK_JOBS, status=Status.OK, summary=got, evidence=evidence)
    if soft >= CHECK_MEMLOCK_BYTES:
        return finding(id=ids.MEMLOCK_JOBS, status=Status.WARN,
                       summary=got + f": enough for gdrprobe check's {need}, not for NCCL (vendors ask for "
                                     "unlimited)",
                       evidence=evidence, fix=memlock_fix(container))
    return finding(id=ids.MEMLOCK_JOBS, status=Status.FAIL,
                   summary=got + f", below even gdrprobe check's {need}: its ibv_reg_mr and ibv_create_qp will "
                                 "fail although this doctor, holding CAP_IPC_LOCK, is not limited",
                   evidence=evidence, fix=memlock_fix(container))


def check(ctx: DoctorContext) -> list[Finding]:
    container = ctx.container
    cap_eff = effective_capabilities(ctx.root)
    own = memlock_limits(ctx.root)
    findings = [limit_finding(own, cap_eff, container, runs_as_root(ctx.root))]
    if cap_eff is not None and has_ipc_lock(cap_eff):
        # Without the capability this process's limit is what its user's jobs get: judged above.
        findings.append(job_finding(ctx, container, own))
    return findings + [capability_finding(ctx.root, cap_eff), container_finding(container)]
