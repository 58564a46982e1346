"""The lab's own logic that needs no guest: command lines and wiring."""

import os
import shlex
import signal

import pytest

from lab import vm
from tests.unit.processes import gone_within


def test_loopback_guest_runs_the_init_script_then_the_command():
    argv = vm.Guest("g", "echo hi").argv("/k/vmlinuz")
    assert argv[:4] == [argv[0], "-r", "/k/vmlinuz", "--disable-kvm"]
    inner = argv[argv.index("--exec") + 1]
    assert inner.endswith("loopback -- echo hi")
    assert not any(a.startswith("--qemu-opts") for a in argv)


def test_wired_guest_gets_its_address_and_socket_backend():
    guest = vm.Guest("b", "true", wire="10.77.0.2", qemu_opts=vm.wire_opts(4321, "listen", 2))
    argv = guest.argv("/k/vmlinuz")
    assert "wire 10.77.0.2/24 --" in argv[argv.index("--exec") + 1]
    opts = [a for a in argv if a.startswith("--qemu-opts=")][0]
    assert "listen=127.0.0.1:4321" in opts and "mac=52:54:00:00:00:02" in opts
    assert "connect=127.0.0.1:4321" in vm.wire_opts(4321, "connect", 1)


def test_acs_iommu_guest_boots_with_the_iommu_on_and_both_root_ports():
    from lab import acs_iommu

    guest = vm.Guest("acs", "true", qemu_opts=acs_iommu.QEMU_OPTS, kernel_args=acs_iommu.KERNEL_ARGS)
    argv = guest.argv("/k/vmlinuz")
    assert argv[argv.index("--append") + 1] == "intel_iommu=on"
    assert argv[-1].startswith("--qemu-opts=")       # vng takes everything after it as QEMU's
    opts = argv[-1]
    assert "-device intel-iommu" in opts and opts.count("pcie-root-port") == 2
    assert "addr=0x10" in opts and "addr=0x11" in opts and opts.count("disable-acs=on") == 1
    assert acs_iommu.ACS_PORT.endswith(":10.0") and acs_iommu.NO_ACS_PORT.endswith(":11.0")


def test_outcomes_are_counted_from_pytest_summaries():
    from lab.suites import count_outcomes

    text = "25 passed in 3.1s\n...\n1 failed, 6 passed, 2 errors in 9s\n"
    assert count_outcomes(text) == (31, 3)


def test_a_guest_past_its_time_out_is_killed_with_its_whole_process_group(monkeypatch):
    """The process-group handling, with a stand-in for vng that starts a child of its own."""
    guest = vm.Guest("slow", "unused")
    monkeypatch.setattr(guest, "argv", lambda kernel: ["bash", "-c", "sleep 300 & echo $!; wait"])
    guest.start("/k/vmlinuz")
    result = guest.wait(timeout=1.0)
    assert result.timed_out and result.returncode == 124
    child = int(result.output.split()[0])
    assert gone_within(child, 5.0), "the guest's child process outlived the time-out"
    assert guest.process.poll() is not None


def test_a_killed_guest_whose_escaped_child_holds_the_pipe_still_returns(monkeypatch):
    """A child that left the group (setsid) outlives the kill and keeps the output pipe
    open: reading it to the end would wait as long as that child lives."""
    monkeypatch.setattr(vm, "KILLED_OUTPUT_S", 1.0)
    guest = vm.Guest("held", "unused")
    monkeypatch.setattr(guest, "argv",
                        lambda kernel: ["bash", "-c", "setsid sleep 300 & echo $!; wait"])
    guest.start("/k/vmlinuz")
    escaped = None
    try:
        result = guest.wait(timeout=1.0)
        escaped = int(result.output.split()[0])
        assert result.timed_out and result.returncode == 124
        assert "the pipe is still held open" in result.output
    finally:
        if escaped is not None:
            os.kill(escaped, signal.SIGKILL)


def test_a_set_up_step_that_hangs_is_a_lab_error_naming_it(monkeypatch):
    from lab import kernel
    monkeypatch.setattr(kernel, "STEP_TIMEOUT_S", 0.5)
    with pytest.raises(kernel.LabError, match="'sleep 30' did not end within 0.5 s"):
        kernel.run(["sleep", "30"])


def test_demo_dmabufs_bidirectional_row_reads_the_host_and_deciding_arms_only():
    """A degraded two-ended A/B runs its direction arms too (each with both directions):
    the row sums the host arm and the deciding arm, and an inconclusive answer (exit 12)
    passes as the WRITE A/B's does."""
    from lab.dmabuf_rows import bidir_row

    def arm(name, role, there, back):
        return {"arm": name, "role": role,
                "bidirectional": [{"client_to_server_gbps": there, "server_to_client_gbps": back}]}

    report = {"verdict": {"classification": "degraded", "exit_code": 12, "ratio": 0.9,
                          "mechanism": "dmabuf", "inconclusive": True},
              "arms": [arm("host", "", 0.5, 0.5), arm("dmabuf", "decides", 0.4, 0.5),
                       arm("dmabuf", "diagnoses", 0.5, 0.5), arm("dmabuf", "diagnoses", 0.5, 0.4)]}
    text, good = bidir_row(report)
    assert good and text.count("Gb/s") == 2, text
    assert text.startswith("host 0.50 + 0.50 = 1.00 Gb/s; dmabuf 0.40 + 0.50 = 0.90 Gb/s")
    report["verdict"] |= {"exit_code": 1, "inconclusive": False}
    assert bidir_row(report)[1] is False        # a conclusive drain answer fails the demo


def test_rails_guest_puts_two_gpus_and_two_nics_under_one_switch():
    from lab import rails

    opts = vm.Guest("rails", "true", qemu_opts=rails.QEMU_OPTS).argv("/k/vmlinuz")[-1]
    assert opts.count("x3130-upstream") == 1 and opts.count("xio3130-downstream") == 4
    # Two stand-in GPUs first, then the two e1000e the rails ride on: the kernel numbers the
    # downstream ports' buses 03 to 06 in that order, which GPU_BUS_IDS and NIC_BUS_IDS name.
    assert opts.index("virtio-rng-pci,bus=rail0") < opts.index("virtio-rng-pci,bus=rail1") \
        < opts.index("e1000e,netdev=railnet0,bus=rail2") < opts.index("e1000e,netdev=railnet1,bus=rail3")
    assert rails.GPU_BUS_IDS == ("0000:03:00.0", "0000:04:00.0")
    assert rails.NIC_BUS_IDS == ("0000:05:00.0", "0000:06:00.0")
    # Capped, the uplink carries less than the two rails' line rates: they must contend.
    assert rails.CASES["capped"] == (rails.RAIL_MBIT, rails.UPLINK_MBIT)
    assert rails.UPLINK_MBIT < 2 * rails.RAIL_MBIT and rails.CASES["uncapped"][1] == 0


def test_the_lab_suites_list_their_slowest_tests_and_take_the_extra_arguments(monkeypatch):
    """python -m lab test's command lines, with the guests replaced: each suite's pytest
    lists its slowest tests (so a CI log shows where the guests' minutes go), and the extra
    pytest arguments come after the suite's path."""
    from lab import suites

    commands = []

    def run_loopback(command, timeout):
        commands.append(command)
        return vm.GuestResult("gdr-lo", 0, "2 passed in 9.0s", 9.0)

    def run_pair(command_a, command_b, timeout):
        commands.append(command_a)
        return (vm.GuestResult("gdr-a", 0, "1 passed in 3.0s", 3.0),
                vm.GuestResult("gdr-b", 0, "", 3.0))

    monkeypatch.setattr(suites, "prepare_dmabuf_modules", lambda: None)
    monkeypatch.setattr(vm, "run_loopback", run_loopback)
    monkeypatch.setattr(vm, "run_pair", run_pair)
    assert suites.run_suites(["-k", "gid table"]) == 0
    for command, path in zip(commands, (suites.LOOPBACK_TESTS, suites.PAIR_TESTS)):
        argv = shlex.split(command)
        assert argv[1:3] == ["-m", "pytest"]
        assert f"--durations={suites.SLOWEST_TESTS_SHOWN}" in argv[:argv.index(path)]
        assert argv[argv.index(path):] == [path, "-k", "gid table"]
    assert len(commands) == 2
