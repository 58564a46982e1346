from __future__ import annotations

from .stack_machines import memlock_machine, write

from gdrprobe.doctor.checks import memlock
from gdrprobe.report.model import Status

CAP_IPC_LOCK_ONLY = f"{1 << 14:016x}"


def by_id(findings):
    return {finding.id: finding for finding in findings}


def test_low_memlock_without_cap_on_host_fails_with_limits_conf(tmp_path):
    found = by_id(memlock.check(memlock_machine(tmp_path, "65536", "65536")))
    limit = found["memlock.limit"]
    assert limit.status is Status.FAIL
    assert limit.evidence[0].value == "soft 65536, hard 65536"
    assert "/etc/security/limits.conf" in limit.fix
    assert found["memlock.cap_ipc_lock"].summary == "CAP_IPC_LOCK is not in the effective set"
    assert found["memlock.container"].summary == "not running in a container"


def test_low_memlock_in_a_pod_gets_the_ipc_lock_fix(tmp_path):
    ctx = memlock_machine(tmp_path, "4194304", "4194304", environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                          cgroup="12:memory:/kubepods/burstable/pod1234/abcd\n")
    found = by_id(memlock.check(ctx))
    assert found["memlock.limit"].status is Status.FAIL
    assert 'capabilities.add: ["IPC_LOCK"]' in found["memlock.limit"].fix
    assert found["memlock.container"].summary == "running in a kubernetes container"


def pod(tmp_path, uid: int, cap_bnd: str, cap_eff: str = "0000000000000000"):
    ctx = memlock_machine(tmp_path, "4194304", "4194304", environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                          cgroup="12:memory:/kubepods/burstable/pod1234/abcd\n", cap_eff=cap_eff)
    write(tmp_path, "/proc/self/status", f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                                         f"CapInh:\t0000000000000000\nCapEff:\t{cap_eff}\nCapBnd:\t{cap_bnd}\n")
    return ctx


def test_a_non_root_pod_is_told_to_raise_the_runtimes_limit_not_to_add_ipc_lock(tmp_path):
    """Was: add IPC_LOCK, which a non-root container's process never gets: Kubernetes sets no
    ambient capabilities (kubernetes/kubernetes#56374), so it stays in the bounding set only."""
    found = by_id(memlock.check(pod(tmp_path, uid=1000, cap_bnd=CAP_IPC_LOCK_ONLY)))
    limit = found["memlock.limit"]
    assert limit.status is Status.FAIL
    assert "non-root" in limit.fix and "LimitMEMLOCK=infinity" in limit.fix and "default_ulimits" in limit.fix
    assert 'capabilities.add: ["IPC_LOCK"]' not in limit.fix
    capability = found["memlock.cap_ipc_lock"]
    assert "in the bounding set but not the effective set" in capability.summary
    assert ("/proc/self/status Uid", "1000 (not root)") in [(e.source, e.value) for e in capability.evidence]


def test_a_root_pod_still_gets_the_ipc_lock_fix(tmp_path):
    found = by_id(memlock.check(pod(tmp_path, uid=0, cap_bnd="00000000a80425fb")))
    assert 'capabilities.add: ["IPC_LOCK"]' in found["memlock.limit"].fix
    assert "LimitMEMLOCK" not in found["memlock.limit"].fix


def test_the_kernels_8_mib_is_what_the_check_needs_so_it_warns_not_fails(tmp_path):
    """Was: FAIL "below even the probe's 68 MiB" (a whole sweep's), while `gdrprobe check`
    pins 8 MiB at least and runs there (issue 41): the doctor and the check agree."""
    ctx = memlock_machine(tmp_path, "8388608", "8388608",
                          environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                          cgroup="12:memory:/kubepods/burstable/pod1234/abcd\n")
    limit = by_id(memlock.check(ctx))["memlock.limit"]
    assert limit.status is Status.WARN
    assert "covers the 8 MiB gdrprobe check pins at least" in limit.summary
    assert 'capabilities.add: ["IPC_LOCK"]' in limit.fix
    ctx = memlock_machine(tmp_path, "unlimited", "unlimited", cap_eff=CAP_IPC_LOCK_ONLY)
    write(tmp_path, "/proc/sys/kernel/osrelease", "6.1.0-28-amd64")        # 8 MiB by default
    jobs = by_id(memlock.check(ctx))["memlock.jobs"]
    assert jobs.status is Status.WARN
    assert "enough for gdrprobe check's 8 MiB, not for NCCL" in jobs.summary


def test_docker_container_gets_the_ulimit_fix(tmp_path):
    ctx = memlock_machine(tmp_path, "65536", "65536")
    write(tmp_path, "/.dockerenv")
    assert "--ulimit memlock=-1:-1" in by_id(memlock.check(ctx))["memlock.limit"].fix


def test_cap_ipc_lock_lifts_a_low_limit_for_this_process_only(tmp_path):
    """Was: OK and nothing else. A root doctor passes because of its capability; the users
    of the host get the 64 KiB the kernel (before 5.16) gives, and their jobs will fail."""
    ctx = memlock_machine(tmp_path, "65536", "65536", cap_eff=CAP_IPC_LOCK_ONLY)
    write(tmp_path, "/proc/sys/kernel/osrelease", "5.15.0-118-generic")
    found = by_id(memlock.check(ctx))
    assert found["memlock.limit"].status is Status.OK
    assert "holds CAP_IPC_LOCK, which lifts it" in found["memlock.limit"].summary
    jobs = found["memlock.jobs"]
    assert jobs.status is Status.FAIL
    assert jobs.summary.startswith("a job without CAP_IPC_LOCK gets memlock 64 KiB from the kernel's default")
    assert ("/proc/sys/kernel/osrelease", "5.15.0-118-generic: kernel default 64 KiB") in [
        (e.source, e.value) for e in jobs.evidence]
    assert "/etc/security/limits.conf" in jobs.fix


def test_root_doctor_reads_what_limits_conf_gives_users(tmp_path):
    ctx = memlock_machine(tmp_path, "unlimited", "unlimited", cap_eff=f"{(1 << 41) - 1:016x}")
    write(tmp_path, "/etc/security/limits.conf", "# defaults\n*    hard    memlock    65536\n")
    write(tmp_path, "/etc/security/limits.d/90-rdma.conf", "*  -  memlock  131072   # 128 MiB\n")
    write(tmp_path, "/etc/systemd/system.conf", "[Manager]\nDefaultLimitMEMLOCK=infinity\n")
    jobs = by_id(memlock.check(ctx))["memlock.jobs"]
    assert jobs.status is Status.WARN
    assert "128 MiB from pam_limits" in jobs.summary and "not for NCCL" in jobs.summary
    assert [e.source for e in jobs.evidence] == ["/etc/security/limits.conf",
                                                 "/etc/security/limits.d/90-rdma.conf"]


def test_systemd_default_when_limits_conf_is_silent(tmp_path):
    ctx = memlock_machine(tmp_path, "unlimited", "unlimited", cap_eff=CAP_IPC_LOCK_ONLY)
    write(tmp_path, "/etc/systemd/system.conf.d/rdma.conf", "[Manager]\nDefaultLimitMEMLOCK=infinity:infinity\n")
    jobs = by_id(memlock.check(ctx))["memlock.jobs"]
    assert jobs.status is Status.OK and "unlimited from systemd's DefaultLimitMEMLOCK" in jobs.summary


def test_a_limit_that_covers_the_probe_is_not_enough_for_an_rdma_job(tmp_path):
    """Was: OK (judged against what the probe pins). NCCL and perftest need unlimited."""
    found = by_id(memlock.check(memlock_machine(tmp_path, str(128 << 20), str(128 << 20))))
    limit = found["memlock.limit"]
    assert limit.status is Status.WARN
    assert f"covers the {memlock.CHECK_MEMLOCK_BYTES >> 20} MiB gdrprobe check pins at least" \
        in limit.summary and "but not an RDMA job" in limit.summary
    assert "memlock.jobs" not in found      # without the capability, this limit is the jobs' limit


def test_soft_limit_below_a_sufficient_hard_limit_warns(tmp_path):
    limit = by_id(memlock.check(memlock_machine(tmp_path, "65536", "unlimited")))["memlock.limit"]
    assert limit.status is Status.WARN
    assert "ulimit -l unlimited" in limit.fix


def test_unlimited_is_ok(tmp_path):
    findings = by_id(memlock.check(memlock_machine(tmp_path, "unlimited", "unlimited")))
    assert findings["memlock.limit"].status is Status.OK
