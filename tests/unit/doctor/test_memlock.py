from __future__ import annotations

from .stack_machines import memlock_machine, write

from gdrprobe.doctor import memlock
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
    ctx = memlock_machine(tmp_path, "8388608", "8388608", environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                          cgroup="12:memory:/kubepods/burstable/pod1234/abcd\n")
    found = by_id(memlock.check(ctx))
    assert found["memlock.limit"].status is Status.FAIL
    assert 'capabilities.add: ["IPC_LOCK"]' in found["memlock.limit"].fix
    assert found["memlock.container"].summary == "running in a kubernetes container"


def test_docker_container_gets_the_ulimit_fix(tmp_path):
    ctx = memlock_machine(tmp_path, "65536", "65536")
    write(tmp_path, "/.dockerenv")
    assert "--ulimit memlock=-1:-1" in by_id(memlock.check(ctx))["memlock.limit"].fix


def test_cap_ipc_lock_lifts_a_low_limit(tmp_path):
    found = by_id(memlock.check(memlock_machine(tmp_path, "65536", "65536", cap_eff=CAP_IPC_LOCK_ONLY)))
    assert found["memlock.limit"].status is Status.OK
    assert "CAP_IPC_LOCK lifts it" in found["memlock.limit"].summary


def test_soft_limit_below_a_sufficient_hard_limit_warns(tmp_path):
    limit = by_id(memlock.check(memlock_machine(tmp_path, "65536", "unlimited")))["memlock.limit"]
    assert limit.status is Status.WARN
    assert "ulimit -l unlimited" in limit.fix


def test_unlimited_is_ok(tmp_path):
    assert by_id(memlock.check(memlock_machine(tmp_path, "unlimited", "unlimited")))["memlock.limit"].status is Status.OK
