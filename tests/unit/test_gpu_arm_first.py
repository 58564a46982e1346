"""No silent wait: an A/B whose GPU arm cannot run here answers "not testable" with the
cause before its host arm measures anything (it measured 52 s in the lab guest before
saying libcuda was missing)."""

from __future__ import annotations

import pytest

import gdrprobe
from gdrprobe.errors import ExitCode, NoRdmaDevice, NotTestable
from gdrprobe.nccl.versions import NcclRules

NO_LIBCUDA = "libcuda.so.1: cannot open shared object file: No such file or directory"
TOKEN = "a-token-of-32-characters-or-more-0123"


class Stop(Exception):
    """Raised by the fake engine: a run was about to start."""


@pytest.fixture
def machine(monkeypatch):
    """An RDMA device, no CUDA driver, and an engine that records instead of measuring."""
    from gdrprobe.campaign import machine as campaign_machine
    from gdrprobe.measure import loopback
    from gdrprobe.memory import cuda_driver
    from gdrprobe.rdma import verbs

    started = []

    def runner(*args, **kwargs):
        def probe(local, remote):
            started.append(local)
            raise Stop
        return probe

    monkeypatch.setattr(verbs, "devices", lambda: {"rxe0": None})
    monkeypatch.setattr(cuda_driver, "driver_library_error", lambda: NO_LIBCUDA)
    monkeypatch.setattr(loopback, "runner", runner)
    monkeypatch.setattr(campaign_machine, "run_facts", lambda local, loopback: None)
    monkeypatch.setattr(campaign_machine, "nccl_view", lambda: ({}, NcclRules()))
    return started


@pytest.mark.parametrize("arguments", [{"mem": "gpu"}, {"mem": "dmabuf"},
                                       {"remote_mem": "gpu"}, {"mem": "staged"}])
def test_no_cuda_driver_is_the_answer_before_the_host_arm_runs(machine, arguments):
    with pytest.raises(NotTestable) as raised:
        gdrprobe.run(loopback=True, **arguments)
    assert machine == []                                    # nothing was measured
    error = raised.value
    assert error.cause == "not testable: no CUDA driver (libcuda.so.1 could not be loaded)"
    assert error.evidence == f"dlopen(libcuda.so.1): {NO_LIBCUDA}"
    assert error.exit_code == ExitCode.NOT_TESTABLE and "NVIDIA driver" in error.fix


def test_a_gpu_buffer_on_the_server_needs_no_driver_here(machine):
    with pytest.raises(Stop):
        gdrprobe.run("10.0.0.2", token=TOKEN, remote_mem="gpu")
    assert [spec.kind for spec in machine] == ["host"]       # the host arm started


def test_no_rdma_device_is_said_first(machine, monkeypatch):
    from gdrprobe.rdma import verbs

    def none():
        raise NoRdmaDevice("no RDMA device found", "load a driver", evidence="empty list")
    monkeypatch.setattr(verbs, "devices", none)
    with pytest.raises(NotTestable, match="not testable: no RDMA device found"):
        gdrprobe.run(loopback=True, mem="gpu")
    assert machine == []


def test_the_command_exits_9_with_the_cause_at_once(machine, capsys):
    from gdrprobe.cli import main

    assert main(["run", "--loopback", "--mem", "gpu"]) == 9
    error = capsys.readouterr().err
    assert "not testable: no CUDA driver" in error and "fix:" in error
    assert machine == []
