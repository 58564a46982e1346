"""Bad input is refused before the node is probed, by the public API so that both doors
share it (issue 29): a percent where a fraction is meant (--threshold 90 would drain every
node), a GPU that is neither an ordinal nor a bus id, --repeats 0, HOST:PORT, a --nccl path
that is not there; `gdrprobe.check()` answers "not testable" with the report the docs show;
the doctor's first blocker is a failure where one exists. The machine is never read: its
entry point is replaced by a recorder that fails the test if it is reached."""

from __future__ import annotations

import pytest

import gdrprobe
from gdrprobe.cli import main
from gdrprobe.errors import NotTestable, UsageError


@pytest.fixture
def probed(monkeypatch):
    """What reading the machine or measuring would do: recorded, never done."""
    from gdrprobe.campaign import machine
    from gdrprobe.measure import loopback
    from gdrprobe.rdma import verbs

    calls = []

    def reached(what):
        def record(*args, **kwargs):
            calls.append(what)
            raise AssertionError(f"{what} reached before the arguments were checked")
        return record

    monkeypatch.setattr(machine, "machine_facts", reached("machine_facts"))
    monkeypatch.setattr(loopback, "runner", reached("runner"))
    monkeypatch.setattr(verbs, "devices", reached("devices"))
    return calls


@pytest.mark.parametrize("call, said", [
    (lambda: gdrprobe.check(threshold=90), "--threshold 90 is over 1: it is a fraction"),
    (lambda: gdrprobe.check_node(threshold=90), "--threshold 0.9 if you meant 90%"),
    (lambda: gdrprobe.check(floor=80), "--floor 0.8 if you meant 80%"),
    (lambda: gdrprobe.check(gpu="abc"), "GPU 'abc' is neither a GPU ordinal nor a PCI bus"),
    (lambda: gdrprobe.check(repeats=0), "--repeats 0: use a whole number from 1 to 100"),
    (lambda: gdrprobe.check_node(repeats=0), "--repeats 0"),
    (lambda: gdrprobe.run(loopback=True, threshold=90), "--threshold 90 is over 1"),
    (lambda: gdrprobe.run(loopback=True, mem="gpu", gpu="abc"), "GPU 'abc'"),
    (lambda: gdrprobe.run("10.0.0.2:18515", token="t" * 40), "'10.0.0.2 -p 18515'"),
    (lambda: gdrprobe.bench(threshold=90), "--threshold 90 is over 1"),
    (lambda: gdrprobe.bench(gpus=("abc",)), "GPU 'abc'"),
    (lambda: gdrprobe.cluster(slow_fraction=70), "--slow-fraction 0.7 if you meant 70%"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_the_api_refuses_bad_arguments_before_it_reads_the_machine(probed, call, said):
    with pytest.raises(UsageError) as refused:
        call()
    assert said in str(refused.value) and refused.value.exit_code == 2
    assert probed == []


@pytest.mark.parametrize("argv", [["check", "--threshold", "90"], ["check", "--node",
                                  "--threshold", "90"], ["check", "--gpu", "abc"],
                                  ["check", "--repeats", "0"], ["run", "--loopback",
                                  "--mem", "gpu", "--threshold", "90"]], ids=" ".join)
def test_the_command_line_refuses_them_too_with_exit_2(probed, argv, capsys):
    """In a prolog --gpu abc or --repeats 0 came back as "not testable" (a warning: the job
    starts) after the node was probed; --threshold 90 would have drained every node."""
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("gdrprobe: error: ")
    assert probed == []


@pytest.mark.parametrize("gpu", ["0", "7", "0000:3b:00.0", "3b:00.0", "0000:3b:00",
                                 "00000000:3B:00.0"])
def test_every_form_a_runtime_reads_is_taken(gpu):
    from gdrprobe.memory.runtime import check_gpu_selector

    check_gpu_selector(gpu)


@pytest.mark.parametrize("gpu", ["abc", "3b:00", "-1", "GPU-0", "0x3b", ""])
def test_what_no_runtime_reads_is_refused(gpu):
    from gdrprobe.memory.runtime import check_gpu_selector

    with pytest.raises(UsageError, match="neither a GPU ordinal nor a PCI bus id"):
        check_gpu_selector(gpu)


def test_an_ipv6_address_is_a_host_not_a_host_and_port(probed):
    """Only one colon makes HOST:PORT; an IPv6 literal has several."""
    with pytest.raises(AssertionError, match="reached before"):
        gdrprobe.run("fe80::1", token="t" * 40)


def test_doctor_nccl_that_is_not_there_is_an_error_not_ignored(tmp_path, capsys):
    """--nccl /nonexistent fell back to the loader's search in silence, and the doctor judged
    another libnccl than the one asked about."""
    assert main(["doctor", "--nccl", str(tmp_path / "nonexistent")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--nccl"):
        gdrprobe.capture(str(tmp_path / "capture"), nccl=str(tmp_path / "nonexistent"))
    assert not (tmp_path / "capture").exists()


# ---- check() answers "not testable" with its report ----------------------------------------


def test_check_answers_not_testable_with_the_report_the_docs_show(monkeypatch, tmp_path):
    """README and docs/api.md: check() returns a CheckReport whose verdict is "not testable"
    (exit 9) where no RDMA device is there; it raised NotTestable instead."""
    from gdrprobe.campaign import prelaunch
    from gdrprobe.campaign.machine import machine_facts
    from tests.unit.doctor import nccl_machines as nm

    nm.dmabuf_only(tmp_path)
    facts = machine_facts(str(tmp_path), {})
    monkeypatch.setattr("gdrprobe.campaign.machine.machine_facts", lambda **_: facts)

    def no_device(*args, **kwargs):
        raise NotTestable("not testable: no RDMA device found", "load the RDMA driver",
                          evidence="Failed to get devices list")

    monkeypatch.setattr(prelaunch, "check_pair", no_device)
    report = gdrprobe.check(gpu="0000:1b:00.0", time_budget_s=30)
    verdict = report.verdict
    assert (verdict.classification, verdict.exit_code) == ("not testable", 9)
    assert verdict.likely_causes == ("not testable: no RDMA device found",)
    assert verdict.fix == "load the RDMA driver" and report.settings is None
    assert report.placement.gpu == "0000:1b:00.0" and report.placement.time_budget_s == 30
    with pytest.raises(NotTestable, match="no RDMA device found"):
        gdrprobe.require(gpu="0000:1b:00.0", time_budget_s=30)
