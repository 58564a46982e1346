"""benchmarks/boot_ratios.py: the boot as the unit of a comparison with perftest. What it
reads from compare_perftest.py's per-pair lines, which boots it leaves out as disturbed, and
the statistics it prints; booting the lab is not exercised here (that is the benchmark's run)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.unit.processes import gone_within, holding

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "boot_ratios.py"


def load():
    spec = importlib.util.spec_from_file_location("boot_ratios", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["boot_ratios"] = module   # dataclasses looks its module up by name
    spec.loader.exec_module(module)
    return module


boot_ratios = load()

# Four boots as compare_perftest.py prints them (tables and per-pair lines), boot 3 with a
# perftest run at half rate: the host's load, not either program.
LOG = """\
== boot 1
| 1024 | 65536 | 50.00 | 51.00 | 1.020 (1.000-1.040) | 1.0 | 1.0 |
# 1024 B, MiB/s per pair (perftest/gdrprobe): 50.00/51.00, 50.00/51.00
# 8 B, us per pair (perftest/gdrprobe): 12.00/11.00, 12.00/13.00
== boot 2
# 1024 B, MiB/s per pair (perftest/gdrprobe): 50.00/49.00, 50.00/49.00
== boot 3
# 1024 B, MiB/s per pair (perftest/gdrprobe): 25.00/50.00, 50.00/50.00
== boot 4
# 1024 B, MiB/s per pair (perftest/gdrprobe): 50.00/48.00, 50.00/50.00
"""


def test_pairs_are_read_per_unit_size_and_boot():
    sizes = boot_ratios.parse_log(LOG.splitlines())
    assert sorted(sizes) == [("MiB/s", 1024), ("us", 8)]
    assert [b.boot for b in sizes[("MiB/s", 1024)]] == [1, 2, 3, 4]
    assert sizes[("MiB/s", 1024)][0].pairs == ((50.0, 51.0), (50.0, 51.0))
    assert sizes[("us", 8)][0].ratio() == pytest.approx((11 / 12 + 13 / 12) / 2)


def test_a_boot_with_a_halved_run_is_left_out():
    boots = boot_ratios.parse_log(LOG.splitlines())[("MiB/s", 1024)]
    assert [b.boot for b in boot_ratios.undisturbed(boots)] == [1, 2, 4]


def test_a_latency_twice_the_typical_is_disturbed():
    slow = boot_ratios.BootPairs(2, "us", ((12.0, 30.0), (12.0, 12.0)))
    fine = boot_ratios.BootPairs(1, "us", ((12.0, 12.5), (12.0, 11.5)))
    assert boot_ratios.undisturbed([fine, slow]) == [fine]


def test_ahead_means_more_bytes_or_less_time():
    assert boot_ratios.BootPairs(1, "MiB/s", ((50.0, 51.0),)).ahead()
    assert not boot_ratios.BootPairs(1, "MiB/s", ((50.0, 49.0),)).ahead()
    assert boot_ratios.BootPairs(1, "us", ((12.0, 11.0),)).ahead()
    assert not boot_ratios.BootPairs(1, "us", ((12.0, 13.0),)).ahead()


def test_summary_counts_boots_and_centres_on_the_median_boot():
    boots = boot_ratios.parse_log(LOG.splitlines())[("MiB/s", 1024)]
    line = boot_ratios.summary("MiB/s", 1024, boots)
    # Boots 1, 2 and 4: 1.020, 0.980 and the median of 0.960 and 1.000, 0.980.
    assert line.startswith("1024 B, MiB/s: 3 of 4 boots, median ratio 0.980 (95% ")
    assert "gdrprobe ahead in 1;" in line
    assert line.endswith("boots: 1.020 0.980 0.980")


def test_one_boot_gives_no_interval():
    boots = boot_ratios.parse_log(LOG.splitlines())[("us", 8)]
    assert boot_ratios.summary("us", 8, boots).endswith("(too few undisturbed boots for an interval)")


def test_the_t_point_falls_back_to_the_nearest_smaller_table_entry():
    assert boot_ratios.t95(11) == boot_ratios.T95[10]
    assert boot_ratios.t95(1000) == 2.0


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_from_reads_kept_logs(tmp_path):
    log = tmp_path / "boots.log"
    log.write_text(LOG)
    done = run("--from", str(log))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("1024 B, MiB/s: 3 of 4 boots")


@pytest.mark.parametrize("args", [["--boots", "1", "--sizes", "64"],
                                  ["--from", "x.log", "--", "--sizes", "64"]])
def test_misplaced_arguments_are_refused_before_any_boot(args):
    done = run(*args)
    assert done.returncode == 2
    assert "error:" in done.stderr


# How long an interrupted boot may take to end its guest: well under the guest's own 600 s,
# so that a guest left running fails the test rather than ending by itself first.
GUEST_DOWN_S = 20


def boot_like_the_lab(token: str, on_interrupt: str = "raise") -> list[str]:
    """A boot as the lab runs one: it starts a grandchild (QEMU) in a session of its own,
    out of reach of a signal to the boot's, and kills it on the way out of an interrupt."""
    return [sys.executable, "-c", textwrap.dedent(f"""
        import signal, subprocess, sys, time
        if {on_interrupt!r} == "ignore":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        guest = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {token!r}],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        try:
            time.sleep(60)
        finally:
            guest.kill()
        """)]


def test_every_boot_lands_in_the_log_and_a_late_one_does_not_end_the_run(tmp_path):
    log = tmp_path / "boots.log"
    pair = "# 64 B, MiB/s per pair (perftest/gdrprobe): 5.00/5.10"
    boot_ratios.run_boots(2, str(log), [sys.executable, "-c", f"print({pair!r})"], 30)
    # The late boot is interrupted, and takes its guest down (on a loaded machine it may be
    # stopped before it starts one: none lives either).
    token = f"boot-ratios-grandchild-{os.getpid()}"
    boot_ratios.run_boots(1, str(log), boot_like_the_lab(token), 2)
    lines = log.read_text().splitlines()
    assert lines[:5] == ["== boot 1", pair, "== boot 2", pair, "== boot 1"]
    assert all(gone_within(pid, GUEST_DOWN_S) for pid in holding(token))
    assert len(boot_ratios.parse_log(lines)[("MiB/s", 64)]) == 2


def test_a_boot_hears_the_interrupt_where_this_script_was_started_deaf_to_it():
    """nohup and a background job start this script with SIGINT ignored, which a boot would
    inherit; the boot starts with SIGINT as a terminal leaves it."""
    token = f"boot-ratios-nohup-{os.getpid()}"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _, outcome = boot_ratios.one_boot(boot_like_the_lab(token), 2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert outcome == "timed out"
    assert all(gone_within(pid, GUEST_DOWN_S) for pid in holding(token))


def test_a_boot_deaf_to_the_interrupt_is_killed_after_the_grace(monkeypatch):
    monkeypatch.setattr(boot_ratios, "STOP_GRACE_S", 1.0)
    token = f"boot-ratios-deaf-{os.getpid()}"
    _, outcome = boot_ratios.one_boot(boot_like_the_lab(token, on_interrupt="ignore"), 2)
    assert outcome == "timed out"
    # The boot is killed; its guest, in a session of its own, was the boot's to end (the
    # lab's, which does), so this boot leaves it: the test ends it.
    left = {pid: pathlib.Path(f"/proc/{pid}/cmdline").read_bytes() for pid in holding(token)}
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert [pid for pid, line in left.items() if b"guest.kill()" in line] == []


def test_an_interrupt_ends_the_boot_and_all_it_started(tmp_path):
    """Ctrl-C reaches only this process (the boot has a session of its own): the boot is
    interrupted and takes its guest down before the interrupt goes on up."""
    token = f"boot-ratios-interrupted-{os.getpid()}"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            boot_ratios.one_boot(boot_like_the_lab(token), 30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert all(gone_within(pid, GUEST_DOWN_S) for pid in holding(token))


def test_a_boot_runs_compare_perftest_under_the_lab():
    command = boot_ratios.boot_command(["--sizes", "64"], 900)
    assert command[1:6] == ["-m", "lab", "loopback", "--timeout", "900"]
    assert command[-3:] == [str(SCRIPT.with_name("compare_perftest.py")), "--sizes", "64"]
