from __future__ import annotations

import argparse
import json
import os
import types

from gdrprobe.cli import doctor as doctor_command
from gdrprobe.doctor import runner
from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.checks import acs, iommu, topology
from gdrprobe.errors import ExitCode
from gdrprobe.report import text as render
from gdrprobe.report.model import DoctorReport, Finding, Status
from tests.unit.doctor import machines, nccl_machines

OWN_CHECKS = (topology, iommu, acs)


def test_crashing_check_becomes_a_failing_finding(tmp_path, monkeypatch):
    broken = types.ModuleType("broken_check")

    def check(ctx):
        raise RuntimeError("boom")

    broken.GROUP, broken.check = "stack", check
    monkeypatch.setattr(runner, "CHECKS", (broken,) + OWN_CHECKS)
    machines.pix_node(tmp_path, pairs=1)
    report = runner.run_doctor(str(tmp_path), environ={})
    crash = report.findings[0]
    assert (crash.id, crash.group, crash.status) == ("stack.crashed", "stack", Status.FAIL)
    assert "gdrprobe bug" in crash.summary
    assert crash.evidence[0].value.startswith("RuntimeError: boom")
    assert any(f.id == "acs.bridge" for f in report.findings)     # later checks still ran


def test_a_crash_alone_exits_internal_not_the_drain_code():
    """A crashed check is a bug in gdrprobe: it must not drain the node (exit 1); a real
    failure beside it still does."""
    crash = Finding("stack.crashed", "stack", Status.FAIL, "the stack check crashed")
    assert DoctorReport("/", (crash,)).exit_code == ExitCode.INTERNAL
    failed = Finding("acs.bridge", "acs", Status.FAIL, "ACS on")
    assert DoctorReport("/", (crash, failed)).exit_code == ExitCode.VERDICT_NOT_OK


def test_findings_follow_flowchart_order_and_first_blocker_leads(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "CHECKS", OWN_CHECKS)
    machines.acs_node(tmp_path, pairs=1)
    report = runner.run_doctor(str(tmp_path), environ={})
    groups = [f.group for f in report.findings]
    assert groups == sorted(groups, key=runner.GROUP_ORDER.index)
    text = render.render_doctor(report)
    assert text.splitlines()[0].startswith("First blocker: acs.bridge: ACS on bridge 0000:1a:00.0")
    assert "[FAIL] acs.bridge" in text and "[ OK ] topology.distance" in text
    assert "\n       fix: Disable ACS on the switch in the BIOS" in text
    assert text.index("== topology ==") < text.index("== iommu ==") < text.index("== acs ==")
    assert report.exit_code == ExitCode.VERDICT_NOT_OK == 1


def test_exit_code_zero_without_failures():
    report = DoctorReport("/", (Finding("x.y", "topology", Status.WARN, "w"),
                                Finding("x.z", "acs", Status.SKIP, "s")))
    assert report.exit_code == 0
    assert render.doctor_headline(report) == "No blocking failure found (1 warning(s))."


def comparable(report):
    return [(f.id, f.status, f.summary, f.evidence, f.fix) for f in report.findings]


def test_capture_replays_to_the_same_findings(tmp_path):
    source, dest = tmp_path / "source", tmp_path / "dest"
    tree = machines.dual_socket_node(source)
    tree.iommu_groups("DMA")
    tree.set_acs("0000:80:01.0")
    tree.software_rdma("rxe0")
    environ = {"NCCL_NET_GDR_LEVEL": "PHB", "HOME": "/root", "UCX_TLS": "rc"}
    original = runner.run_doctor(str(source), environ=environ)
    copied = capture(str(dest), root=str(source), environ=environ)
    replay = runner.run_doctor(str(dest))
    assert comparable(replay) == comparable(original)
    # HOME is kept: NCCL reads $HOME/.nccl.conf (src/misc/param.cc initEnvFunc).
    assert json.loads((dest / "gdrprobe-capture/environ.json").read_text()) == {
        "HOME": "/root", "NCCL_NET_GDR_LEVEL": "PHB", "UCX_TLS": "rc"}
    assert json.loads((dest / "gdrprobe-capture/cuda.json").read_text()) is None
    # sysfs links stay links, with the kernel's relative targets.
    link = dest / "sys/bus/pci/devices/0000:01:00.0"
    assert os.readlink(link) == "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    assert (dest / "sys/devices/pci0000:00/0000:00:01.0/config").stat().st_size == 4096
    assert "/proc/cmdline" in copied
    # Only what the doctor read: attributes nobody asked for stay behind.
    (source / "sys/devices/pci0000:00/0000:00:01.0/unread_attribute").write_text("x")
    capture(str(tmp_path / "again"), root=str(source), environ=environ)
    assert not (tmp_path / "again/sys/devices/pci0000:00/0000:00:01.0/unread_attribute").exists()


def run_cli(argv):
    parser = argparse.ArgumentParser()
    doctor_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_doctor_json_and_capture(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "CHECKS", OWN_CHECKS)
    tree = machines.dual_socket_node(tmp_path / "node")
    # A GDR-capable stack: without one NCCL routes every path through the CPU, and placement
    # is not what fails.
    nccl_machines.healthy_stack(tree, nccl_machines.gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    assert run_cli(["doctor", "--root", str(tmp_path / "node"), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "doctor"
    distance = next(f for f in document["findings"] if f["id"] == "topology.distance")
    assert (distance["group"], distance["status"]) == ("topology", "fail")
    assert distance["evidence"][1] == {"source": "/sys/bus/pci/devices/0000:01:00.0/numa_node",
                                       "value": "0"}
    assert run_cli(["capture", str(tmp_path / "copy"), "--root", str(tmp_path / "node")]) == 0
    assert "replay with: gdrprobe doctor --root" in capsys.readouterr().out
    assert run_cli(["doctor", "--root", str(tmp_path / "copy")]) == 1
    assert capsys.readouterr().out.startswith("First blocker: topology.distance")


def test_device_nodes_are_captured_as_placeholders_without_reading_them(tmp_path):
    """/dev/infiniband/uverbs0 is a character device: its presence is what the doctor
    reads. A FIFO stands in for it here (reading a FIFO with no writer would block)."""
    import os

    from gdrprobe.doctor.capture import capture

    root = tmp_path / "root"
    # A PCI device (a sane /sys) and an RDMA device, so the doctor looks at /dev.
    (root / "sys" / "bus" / "pci" / "devices" / "0000:00:01.0").mkdir(parents=True)
    (root / "sys" / "class" / "infiniband" / "rxe0").mkdir(parents=True)
    (root / "dev" / "infiniband").mkdir(parents=True)
    (root / "proc").mkdir()
    os.mkfifo(root / "dev" / "infiniband" / "uverbs0")
    dest = tmp_path / "capture"
    capture(str(dest), root=str(root), environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    placeholder = dest / "dev" / "infiniband" / "uverbs0"
    assert placeholder.is_file() and placeholder.stat().st_size == 0
    assert "KUBERNETES_SERVICE_HOST" in (dest / "gdrprobe-capture" / "environ.json").read_text()


def test_unreadable_files_are_reported_as_unknown_not_absent(tmp_path):
    """Was: SysRoot turned every OSError into None, so a refused file read as an absent one."""
    from tests.unit.doctor import nccl_machines
    from tests.unit.doctor.stack_machines import DenyingRoot

    nccl_machines.dmabuf_only(tmp_path)
    denied = {"/proc/driver/nvidia/version", "/sys/bus/pci/devices/0000:1a:00.0/config"}
    report = runner.run_doctor(sysroot=DenyingRoot(str(tmp_path), denied), environ={})
    access = report.findings[-1]
    assert (access.id, access.group, access.status) == ("access.denied", "access", Status.SKIP)
    assert sorted(e.source for e in access.evidence) == sorted(denied)
    assert "sudo gdrprobe doctor" in access.fix
    assert next(f for f in report.findings if f.id == "stack.driver").status is Status.SKIP


def test_capture_keeps_nccls_nic_probe_and_nvml_facts(tmp_path):
    from tests.unit.doctor import nccl_machines

    nccl_machines.gh200(tmp_path / "node")
    capture(str(tmp_path / "copy"), root=str(tmp_path / "node"), environ={})
    for name in ("nics.json", "nvml.json"):
        assert (json.loads((tmp_path / "copy/gdrprobe-capture" / name).read_text())
                == json.loads((tmp_path / "node/gdrprobe-capture" / name).read_text()))
    original, replay = runner.run_doctor(str(tmp_path / "node")), runner.run_doctor(str(tmp_path / "copy"))
    assert comparable(replay) == comparable(original) and replay.nccl == original.nccl


# ---- the offline path checks what is on disk -----------------------------------------------


def test_capture_refuses_a_directory_that_is_not_empty_and_merges_nothing(tmp_path):
    import pytest

    from gdrprobe.errors import UsageError

    machines.pix_node(tmp_path / "node", pairs=1)
    dest = tmp_path / "report"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="is not empty: a capture is never merged") as raised:
        capture(str(dest), root=str(tmp_path / "node"), environ={})
    assert "--replace" in raised.value.fix
    with pytest.raises(UsageError, match="not a gdrprobe capture"):    # only a capture goes
        capture(str(dest), root=str(tmp_path / "node"), environ={}, replace=True)
    assert os.listdir(dest) == ["notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["node", "report"]           # nothing left beside


def test_replace_swaps_a_capture_for_a_new_one_and_no_stale_device_survives(tmp_path):
    """A report directory reused across nodes replayed a device the second node lacks."""
    machines.dual_socket_node(tmp_path / "first")                      # mlx5_0 and mlx5_1
    machines.pix_node(tmp_path / "second", pairs=1)                    # mlx5_0 only
    dest = tmp_path / "report"
    capture(str(dest), root=str(tmp_path / "first"), environ={})
    assert (dest / "sys/class/infiniband/mlx5_1").exists()
    capture(str(dest), root=str(tmp_path / "second"), environ={}, replace=True)
    assert not (dest / "sys/class/infiniband/mlx5_1").exists()
    second = runner.run_doctor(str(tmp_path / "second"), environ={})
    assert comparable(runner.run_doctor(str(dest))) == comparable(second)
    assert sorted(os.listdir(tmp_path)) == ["first", "report", "second"]


def test_a_failed_capture_leaves_the_earlier_one_as_it_was(tmp_path, monkeypatch):
    import pytest

    from gdrprobe.doctor import capture as capture_module

    machines.pix_node(tmp_path / "node", pairs=1)
    dest = tmp_path / "report"
    capture(str(dest), root=str(tmp_path / "node"), environ={})
    before = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(capture_module, "_capture_into", interrupted)
    with pytest.raises(KeyboardInterrupt):
        capture(str(dest), root=str(tmp_path / "node"), environ={}, replace=True)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == before
    assert sorted(os.listdir(tmp_path)) == ["node", "report"]


def test_a_failed_swap_puts_the_earlier_capture_back(tmp_path, monkeypatch):
    import pytest

    from gdrprobe.doctor import capture as capture_module

    machines.pix_node(tmp_path / "node", pairs=1)
    dest = tmp_path / "report"
    capture(str(dest), root=str(tmp_path / "node"), environ={})
    before = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    rename = os.rename
    monkeypatch.setattr(capture_module, "_exchange", lambda first, second: False)   # no exchange here

    def refused_into_dest(source, target):
        if str(target) == str(dest) and ".old" not in str(source):
            raise OSError(28, "No space left on device")
        rename(source, target)
    monkeypatch.setattr(capture_module.os, "rename", refused_into_dest)
    with pytest.raises(OSError):
        capture(str(dest), root=str(tmp_path / "node"), environ={}, replace=True)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == before
    assert sorted(os.listdir(tmp_path)) == ["node", "report"]


def test_a_destination_that_cannot_be_made_is_a_usage_error(tmp_path, capsys):
    from gdrprobe.cli import main

    machines.pix_node(tmp_path / "node", pairs=1)
    (tmp_path / "a-file").write_text("")
    assert main(["capture", str(tmp_path / "a-file" / "report"), "--root", str(tmp_path / "node")]) == 2
    error = capsys.readouterr().err
    assert "cannot write a capture into" in error and "fix: pass a DEST in a directory" in error


def test_the_capture_command_says_replace(tmp_path, capsys):
    from gdrprobe.cli import main

    machines.pix_node(tmp_path / "node", pairs=1)
    dest = str(tmp_path / "report")
    assert main(["capture", dest, "--root", str(tmp_path / "node")]) == 0
    assert main(["capture", dest, "--root", str(tmp_path / "node")]) == 2
    assert "--replace" in capsys.readouterr().err
    assert main(["capture", dest, "--root", str(tmp_path / "node"), "--replace"]) == 0


def test_doctor_root_must_be_a_capture_or_a_machine_root(tmp_path, capsys):
    from gdrprobe.cli import main

    assert main(["doctor", "--root", str(tmp_path / "nonexistent")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["doctor", "--root", str(tmp_path / "empty")]) == 2
    error = capsys.readouterr().err
    assert "is neither a capture (no gdrprobe-capture/environ.json) nor a machine's root" in error
    assert "fix: pass a directory written by 'gdrprobe capture DEST'" in error
    machines.pix_node(tmp_path / "machine", pairs=1)                   # sys/ and proc/
    capture(str(tmp_path / "capture"), root=str(tmp_path / "machine"), environ={})
    for root in ("machine", "capture"):
        assert main(["doctor", "--root", str(tmp_path / root)]) in (0, 1)
        assert "== topology ==" in capsys.readouterr().out


# ---- the first blocker ---------------------------------------------------------------------


def test_a_failure_leads_and_no_gpu_with_a_software_nic_leads_only_without_one(tmp_path):
    """The lab guest: rxe0 and no GPU. The headline's first blocker is the failure the exit
    code 1 is about (memlock), never a warning while a failure stands; without a failure the
    warning that GPUDirect RDMA cannot happen here leads (issue 29)."""
    tree = machines.SysfsTree(tmp_path)
    tree.software_rdma("rxe0")
    found = runner.run_doctor(str(tmp_path), environ={})
    report = DoctorReport(found.root, tuple(f for f in found.findings
                                            if f.status is not Status.FAIL))
    assert render.doctor_headline(report).startswith(
        "First blocker: topology.devices: no NVIDIA GPU and PCI RDMA NIC found: GPUDirect "
        "RDMA cannot happen")
    memlock = Finding("memlock.limit", "memlock", Status.FAIL, "memlock limit 8 MiB")
    failing = DoctorReport(report.root, report.findings + (memlock,))
    assert failing.exit_code == 1
    assert render.doctor_headline(failing) == "First blocker: memlock.limit: memlock limit 8 MiB"
    assert render.first_blocker(DoctorReport("/", (memlock,))) == memlock


def test_no_rdma_device_leads_a_memlock_failure_before_it_in_the_flowchart():
    """Issue 41: a memlock limit matters only once there is a device to register with; with
    none, "no RDMA device" is the first thing to fix, whatever failed before it."""
    memlock = Finding("memlock.jobs", "memlock", Status.FAIL, "a job gets memlock 64 KiB")
    no_device = Finding("nic.devices", "nic", Status.FAIL, "no RDMA devices are visible")
    report = DoctorReport("/", (memlock, no_device))
    assert render.first_blocker(report) == no_device
    assert render.doctor_headline(report) == "First blocker: nic.devices: no RDMA devices are visible"
