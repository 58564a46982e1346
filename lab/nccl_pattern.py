"""NCCL's pattern in the lab (issue 40; docs/lab.md#nccls-pattern): one loopback guest with the
lab's rdma_rxe and the dma-buf exporter, its loopback a wire of RAIL_MBIT, three cases, each a
``gdrprobe run --loopback --pattern nccl --json`` judged by the issue's own criteria:

1. **no delay**: the stream and NCCL's pattern at NCCL's step sizes (128 KiB point-to-point,
   512 KiB a Simple collective's step); at 512 KiB the pattern keeps at least 0.9 of the
   stream, answer "sustains".
2. **a delayed wire**: the lab rxe's ``delay_us`` holds every packet DELAY_US on its way
   (a round trip of twice that), chosen so that NCCL's ceiling (8 steps of 128 KiB per step
   time) is at most half the stream; the stream, its queue (256 messages of 128 KiB, 32 MiB,
   in one pass of --integrity-bytes) past the bandwidth-delay product, keeps at least 0.8 of
   its undelayed rate; the pattern falls within 15 % of the
   printed prediction; the answer is "round-trip bound" and names the ceiling.
3. **a slow flush**: no delay, the dma-buf read delay knob (``dmabuf_read_delay_us``) on every
   READ response from a dma-buf MR, NCCL's flush asked for, 8 KiB steps: the A/B with dma-buf
   memory at both ends (the stand-in libcuda.so.1), whose GPU arm's pattern falls below the
   host arm's with its flush phase named.

Every message of every run is checked, in both arms. Host pages behind the dma-bufs and
an emulated CPU behind rxe: this proves the machinery and the arithmetic, not a GPU's.

  python -m lab.nccl_pattern guest FOLDER    (in a loopback guest after
                                              'lab/dmabuf/guest.sh load FOLDER')
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from lab.dmabuf_guest import Built, dmabuf_environment, guest_main, write_rxe_knob
from lab.kernel import REPO, LabError

# The wire's rate (rxe's rail_mbit): well under what the emulated CPUs move, so the wire,
# not the CPUs, sets the stream's rate and a step's bytes in every case. NCCL's pattern in
# loopback costs the guest's two CPUs more than the stream (both its loops poll, as NCCL's
# proxy does, where the stream has one): unshaped, 512 KiB steps reached 0.34 Gb/s against
# the stream's 0.55, so at 200 Mbit/s a busy host's stalls left the pattern 0.84 to 0.88 of
# the stream; at 100 Mbit/s it has three times the wire in CPU.
RAIL_MBIT = 100
# The wire's one-way delay: NCCL's 8 steps of 128 KiB per step time must fall to half the
# stream or less. A 128 KiB step's bytes take 10.5 ms at 100 Mbit/s, and a step alone takes
# them and a round trip and a few ms more: 8 x 128 KiB per step is at most half the stream
# from some 80 ms each way on; 100 ms leaves room (a ceiling of 0.4 of the wire).
DELAY_US = 100000
# A packet window past the bandwidth-delay product (12.5 MB/s x 200 ms is 2.5 MB, 610 packets
# of rxe's 4 KiB): Debian's 128 would cap the stream's QP at 512 KiB a round trip and keep the
# pattern's 8 steps of 128 KiB (256 packets) from one QP's window.
UNACKED_PSNS = 2048
# The emulated guest stalls for tens of milliseconds now and then, and a 200 ms round trip is
# past the QPs' 67 ms retransmit time-out: 8 x 67 ms (as demo-rails).
TIMEOUT_SCALE = 8
FLUSH_DELAY_US = 2000          # every flush READ of a dma-buf MR: rxe's most (RXE_DMABUF_MAX_DELAY_US)
# The slow flush's steps: small, so that a step's bytes (8 KiB at 100 Mbit/s: 0.66 ms) are
# short against its flush, which the flush QP answers one READ at a time, each 2 ms late: the
# flush sets the step time and NCCL's pattern falls with it; at 128 KiB the 8 steps in
# flight would hide 2 ms a step.
FLUSH_STEP = 8192
# Each pass of the stream drains its queue once, a round trip lost. Without a delay, 128
# messages at each of NCCL's step sizes (16 and 64 MiB) reach the wire's rate; on the delayed
# wire a pass of 256 messages of 128 KiB (32 MiB, one pass of --integrity-bytes) takes some
# 2.7 s, past the 0.2 s round trip many times over.
RUN_ARGS = ("-n", "128", "--integrity-bytes", "32M")
DELAYED_ARGS = ("-n", "256", "--integrity-bytes", "32M")
RUN_TIMEOUT_S = 600
P2P, COLLECTIVE = 131072, 524288


def gdrprobe_json(built: Built, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "run", "--loopback", "--pattern",
                           "nccl", "--json", *args], capture_output=True, text=True, cwd=REPO,
                          env=dmabuf_environment(built), timeout=RUN_TIMEOUT_S)
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError as error:
        raise LabError(f"gdrprobe run {' '.join(args)} printed no report (exit "
                       f"{done.returncode}):\n{done.stderr[-3000:]}") from error


def by_size(rows, size: int) -> dict:
    return next(row for row in rows if row["size_bytes"] == size)


def every_step_checked(report: dict) -> bool:
    rows = [*report.get("nccl", ()), *report.get("bandwidth", ())]
    return bool(rows) and all(
        row["integrity"]["messages_checked"] == row["integrity"]["messages_total"]
        and not row["integrity"]["bad_bytes"] and not row["integrity"]["stray_bytes"]
        for row in rows)


def row_text(report: dict, size: int) -> str:
    stream = by_size(report["bandwidth"], size)["bandwidth_avg_gbps"]
    pattern = by_size(report["nccl"], size)
    answer = by_size(report["nccl_answers"], size)
    alone = pattern["alone"]
    return (f"{size} B: stream {stream:.3f} Gb/s, NCCL pattern {pattern['rate_gbps']:.3f} Gb/s, "
            f"a step alone {alone['step_us']:.0f} us (clear-to-send {alone['cts_us']:.0f}, "
            f"data {alone['data_us']:.0f}, flush {alone['flush_us']:.0f}), ceiling "
            f"{pattern['ceiling_gbps']:.3f} Gb/s per connection, predicted "
            f"{answer['predicted_gbps']:.3f} Gb/s: {answer['outcome']}")


class Demo:
    """The three cases in turn, each printed and judged; what a later case compares with."""

    def __init__(self, built: Built):
        self.built = built
        self.undelayed: dict = {}
        self.failed = 0

    def judge(self, name: str, checks: list[tuple[str, bool]]) -> None:
        for what, good in checks:
            print(f"  {'ok' if good else 'WRONG'}: {what}")
            self.failed += not good
        print(f"{name}: {'passed' if all(good for _, good in checks) else 'FAILED'}")

    def no_delay(self) -> None:
        _, report = gdrprobe_json(self.built, *RUN_ARGS)
        self.undelayed = report
        print("== no delay")
        for size in (P2P, COLLECTIVE):
            print("  " + row_text(report, size))
        stream = by_size(report["bandwidth"], COLLECTIVE)["bandwidth_avg_gbps"]
        pattern = by_size(report["nccl"], COLLECTIVE)["rate_gbps"]
        answer = by_size(report["nccl_answers"], COLLECTIVE)
        self.judge("no delay", [
            (f"NCCL's pattern at 512 KiB steps {pattern:.3f} Gb/s is at least 0.9 of the "
             f"stream's {stream:.3f} Gb/s ({pattern / stream:.2f})", pattern >= 0.9 * stream),
            (f"the answer at 512 KiB is \"sustains\": {answer['text'][:120]}...",
             answer["outcome"] == "sustains"),
            ("every message checked, stream and pattern", every_step_checked(report))])

    def delayed(self) -> None:
        write_rxe_knob("delay_us", DELAY_US)
        try:
            _, report = gdrprobe_json(self.built, "-s", str(P2P), *DELAYED_ARGS)
        finally:
            write_rxe_knob("delay_us", 0)
        print(f"== a wire of {DELAY_US / 1000:g} ms each way (rxe delay_us)")
        print("  " + row_text(report, P2P))
        answer = by_size(report["nccl_answers"], P2P)
        print(f"  answer: {answer['text']}")
        for line in answer["raise_by"]:
            print(f"  would raise it: {line}")
        stream = by_size(report["bandwidth"], P2P)["bandwidth_avg_gbps"]
        before = by_size(self.undelayed["bandwidth"], P2P)["bandwidth_avg_gbps"]
        pattern, ceiling = answer["pattern_gbps"], answer["ceiling_gbps"] * answer["channels"]
        predicted = answer["predicted_gbps"]
        self.judge("delayed wire", [
            (f"the stream keeps {stream:.3f} of its undelayed {before:.3f} Gb/s "
             f"({stream / before:.2f}, at least 0.8)", stream >= 0.8 * before),
            (f"the predicted ceiling {ceiling:.3f} Gb/s is at most half the stream's",
             ceiling <= 0.5 * stream),
            (f"NCCL's pattern at 128 KiB x 8 steps {pattern:.3f} Gb/s is within 15 % of the "
             f"prediction {predicted:.3f} Gb/s ({pattern / predicted:.2f})",
             abs(pattern - predicted) <= 0.15 * predicted),
            ("the answer is round-trip bound and names the ceiling",
             answer["outcome"] == "round-trip bound"
             and f"cannot exceed {answer['ceiling_gbps']:.3f} Gb/s per connection" in answer["text"]),
            ("every message checked, stream and pattern", every_step_checked(report))])

    def slow_flush(self) -> None:
        write_rxe_knob("dmabuf_read_delay_us", FLUSH_DELAY_US)
        try:
            code, report = gdrprobe_json(self.built, "-s", str(FLUSH_STEP), "-n", "256",
                                         "--mem", "dmabuf", "--remote-mem", "dmabuf",
                                         "--flush", "--repeats", "3")
        finally:
            write_rxe_knob("dmabuf_read_delay_us", 0)
        check, verdict = report.get("pattern") or {}, report["verdict"]
        ratios = check.get("ratios") or [{}]
        print(f"== a slow flush (rxe dmabuf_read_delay_us {FLUSH_DELAY_US} us per READ of a "
              f"dma-buf MR), dma-buf memory at both ends: exit {code}")
        print(f"  NCCL's pattern: {check.get('outcome')}: {check.get('detail')}")
        print(f"  verdict: {verdict['classification']} (exit {verdict['exit_code']}): "
              + "; ".join(verdict.get("likely_causes", ())[:2]))
        named = ratios[0].get("phase") == "flush"
        joined = verdict["classification"] == "degraded" and any(
            "flush" in cause for cause in verdict.get("likely_causes", ()))
        self.judge("slow flush", [
            ("NCCL's pattern of the GPU arm falls below the host arm's, the flush phase named",
             check.get("outcome") == "degraded" and named),
            ("the verdict joins it (degraded, the flush named), or the stream's own A/B is "
             "inconclusive under emulation (exit 12, then the pattern's answer stands alone)",
             joined or verdict["exit_code"] == 12),
            ("both arms measured, every message checked (a wrong one ends an arm)",
             all(arm["outcome"] == "measured" for arm in report["arms"][:2]))])


CASES: tuple[Callable[[Demo], None], ...] = (Demo.no_delay, Demo.delayed, Demo.slow_flush)


def guest(folder: str) -> int:
    built = Built(folder)
    write_rxe_knob("timeout_scale", TIMEOUT_SCALE)
    write_rxe_knob("unacked_psns", UNACKED_PSNS)
    write_rxe_knob("rail_mbit", RAIL_MBIT)
    demo = Demo(built)
    for case in CASES:
        try:
            case(demo)
        except (LabError, KeyError, StopIteration, subprocess.TimeoutExpired) as error:
            print(f"{case.__name__}: no answer: {error!r}")
            demo.failed += 1
    print(f"nccl-pattern demo: {len(CASES) - min(demo.failed, len(CASES))} case(s) judged, "
          f"{demo.failed} check(s) wrong")
    return 1 if demo.failed else 0


if __name__ == "__main__":
    sys.exit(guest_main(__doc__, guest, sys.argv[1:]))
