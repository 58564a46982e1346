"""compare_perftest.py over many lab boots, with the boot as the unit.

In the lab's guest (TCG, two vCPUs on a shared host) the pairs of one boot are not
independent: the same build gave 0.976 of perftest in every pair of one boot and 1.009 in
the next (benchmarks/RESULTS.md). A ratio a boot moves by 1-2% is settled only over boots:
this script boots the loopback guest once per boot, runs compare_perftest.py with the
arguments given after ``--`` in it, keeps every boot's per-pair figures in a log, and prints
per size the median over boots of each boot's median pair ratio (gdrprobe / perftest), a 95%
bootstrap interval of that median, the mean with its t interval, and in how many boots
gdrprobe was ahead. Give compare_perftest.py an even ``--pairs`` (2 is enough): its pairs
alternate which program runs first, so each boot is then ABBA.

A boot where any run of a size is disturbed, a rate under 0.75 of the size's median run or
a latency over 1/0.75 of it (the host's load halves the guest for a while, whichever program
runs then: RESULTS.md), is left out of that size and counted.

    python benchmarks/boot_ratios.py --boots 20 --log boots.log -- --bidir --only bandwidth \
        --sizes 1024 --pairs 2 --perftest-footprint
    python benchmarks/boot_ratios.py --from boots.log    # the statistics of a kept log
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import re
import signal
import statistics
import subprocess
import sys

PAIR_LINE = re.compile(r"^# (\d+) B, (MiB/s|us) per pair \(perftest/gdrprobe\): (.+)$")
BOOT_LINE = "== boot"
BOOT_MARGIN_S = 300     # past the lab's own bound on the guest: booting and tearing down
STOP_GRACE_S = 30       # for an interrupted lab to take its guest down (TERM, then KILL)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISTURBED = 0.75        # a run this far from its size's median run was slowed by the host
RESAMPLES = 5000
# Two-sided 95% points of Student's t by degrees of freedom; between entries the next
# smaller one's (a wider interval), 2.0 past the table.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


@dataclasses.dataclass(frozen=True)
class BootPairs:
    """One boot's pairs at one size, each (perftest, gdrprobe), in MiB/s or us."""
    boot: int
    unit: str
    pairs: tuple[tuple[float, float], ...]

    def ratio(self) -> float:
        return statistics.median(mine / theirs for theirs, mine in self.pairs)

    def ahead(self) -> bool:
        """gdrprobe moved more a second, or (latency) took less time."""
        return self.ratio() > 1.0 if self.unit == "MiB/s" else self.ratio() < 1.0


def parse_log(lines) -> dict[tuple[str, int], list[BootPairs]]:
    """Per unit (MiB/s or us) and size, every boot's pairs: the log is "== boot N" lines,
    each followed by that boot's compare_perftest.py output (its per-pair lines)."""
    sizes: dict[tuple[str, int], list[BootPairs]] = {}
    boot = 0
    for line in lines:
        if line.startswith(BOOT_LINE):
            boot += 1
        elif found := PAIR_LINE.match(line.strip()):
            pairs = tuple(tuple(float(x) for x in pair.split("/"))
                          for pair in found.group(3).split(", "))
            sizes.setdefault((found.group(2), int(found.group(1))), []).append(
                BootPairs(boot, found.group(2), pairs))
    return sizes


def undisturbed(boots: list[BootPairs]) -> list[BootPairs]:
    """The boots none of whose runs the host's load slowed (DISTURBED)."""
    typical = statistics.median(x for b in boots for pair in b.pairs for x in pair)

    def slowed(value: float, unit: str) -> bool:
        return value < DISTURBED * typical if unit == "MiB/s" else value > typical / DISTURBED

    return [b for b in boots if not any(slowed(x, b.unit) for pair in b.pairs for x in pair)]


def t95(degrees: int) -> float:
    known = [d for d in T95 if d <= degrees]
    return T95[max(known)] if degrees <= max(T95) else 2.0


def summary(unit: str, size: int, boots: list[BootPairs], seed: int = 1) -> str:
    kept = undisturbed(boots)
    ratios = [b.ratio() for b in kept]
    line = f"{size} B, {unit}: {len(kept)} of {len(boots)} boots"
    if len(ratios) < 2:
        return line + " (too few undisturbed boots for an interval)"
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(RESAMPLES))
    low, high = medians[int(0.025 * RESAMPLES)], medians[int(0.975 * RESAMPLES) - 1]
    half = t95(len(ratios) - 1) * statistics.stdev(ratios) / len(ratios) ** 0.5
    mean = statistics.mean(ratios)
    return (f"{line}, median ratio {statistics.median(ratios):.3f} (95% {low:.3f}-{high:.3f}),"
            f" mean {mean:.3f} ({mean - half:.3f}-{mean + half:.3f}), gdrprobe ahead in "
            f"{sum(b.ahead() for b in kept)}; boots: "
            + " ".join(f"{r:.3f}" for r in ratios))


def boot_command(compare_args: list[str], timeout_s: int) -> list[str]:
    """One boot of the loopback guest running compare_perftest.py, bounded by the lab."""
    return [sys.executable, "-m", "lab", "loopback", "--timeout", str(timeout_s), "--",
            sys.executable, os.path.join(REPO, "benchmarks", "compare_perftest.py"),
            *compare_args]


def one_boot(command: list[str], limit_s: float) -> tuple[str, str]:
    """A boot's output and how it ended; the boots before it still count however it ends.
    The boot runs in a session of its own (a Ctrl-C at the terminal reaches only this
    process), and one that overruns, or a Ctrl-C here, is stopped by stop_boot."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=REPO, start_new_session=True,
                          preexec_fn=default_interrupt) as child:
        try:
            output, _ = child.communicate(timeout=limit_s)
            return output, f"exit {child.returncode}"
        except subprocess.TimeoutExpired:
            return stop_boot(child), "timed out"
        except BaseException:
            stop_boot(child)
            raise


def default_interrupt() -> None:
    """In the boot, before it runs: SIGINT as a terminal leaves it, even where this script
    was started with it ignored (nohup, a background job), so the lab can act on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_boot(child: subprocess.Popen) -> str:
    """Interrupt the boot, as Ctrl-C would: the lab starts QEMU in a session of the lab's
    own, out of reach of a signal to this one, and takes its guest down on an interrupt
    (lab/vm.py Guest). What still runs after STOP_GRACE_S is killed. Its output."""
    signal_session(child, signal.SIGINT)
    try:
        return child.communicate(timeout=STOP_GRACE_S)[0]
    except subprocess.TimeoutExpired:
        signal_session(child, signal.SIGKILL)
        return child.communicate()[0]


def signal_session(child: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):   # all of it has ended already
        os.killpg(child.pid, signum)


def run_boots(count: int, log_path: str, command: list[str], limit_s: float) -> None:
    """Run command count times (a boot each), every boot's output into the log."""
    with open(log_path, "a") as log:
        for boot in range(1, count + 1):
            log.write(f"{BOOT_LINE} {boot}\n")
            output, outcome = one_boot(command, limit_s)
            log.write(output)
            log.flush()
            print(f"boot {boot}: {outcome}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boots", type=int, default=20)
    parser.add_argument("--log", default="boots.log", help="appended to; read back at the end")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a boot may take")
    parser.add_argument("--from", dest="logs", nargs="+",
                        help="only the statistics of logs kept by earlier runs")
    args, rest = parser.parse_known_args()
    if args.logs is None:
        if rest[:1] != ["--"]:
            parser.error("compare_perftest.py's arguments go after --")
        run_boots(args.boots, args.log, boot_command(rest[1:], args.timeout),
                  args.timeout + BOOT_MARGIN_S)
    elif rest:
        parser.error("--from reads logs only")
    lines = [line for path in (args.logs or [args.log]) for line in open(path)]
    for (unit, size), boots in sorted(parse_log(lines).items()):
        print(summary(unit, size, boots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
