"""Issue 12's two timing targets: `gdrprobe check` against the equivalent perftest A/B, and
what `gdrprobe bench` costs beyond its measurement windows.

Runs inside a lab guest (or on any host with an RDMA device and perftest installed), one
part per guest boot if the guest is slow:

    python -m lab loopback --timeout 1500 -- \
        .venv/bin/python benchmarks/time_to_verdict.py --part check
    python -m lab loopback --timeout 1500 -- \
        .venv/bin/python benchmarks/time_to_verdict.py --part check --standin --skip-guest-form
    python -m lab loopback --timeout 1500 -- \
        .venv/bin/python benchmarks/time_to_verdict.py --part bench

**check against perftest.** What an operator does by hand to learn whether GPUDirect RDMA
is engaged is a perftest A/B: an `ib_write_bw` server and client in host memory, then the
same with `--use_cuda`, and compare. Debian's perftest has no CUDA and the lab guest has no
GPU, so the stand-in for perftest's A/B is two `ib_write_bw` server+client runs back to
back in host memory, both at 1 MiB messages over 127.0.0.1 on the same device, each moving
as many messages as one arm of the check measured (the check's measured messages per run:
its host arm's median bandwidth x its window / 1 MiB, from a calibration check made
before the timed ones; the check also sends a warm-up before each window, which perftest
is not charged). Each perftest run is timed from the server's spawn (the client is
spawned as soon as the server listens) to both processes' exit; the A/B is the sum of
the two. The gdrprobe side, timed from spawn to exit of `python -m gdrprobe check --json`
(interpreter start, imports, doctor, set-up, runs, exit), has two forms:

- `check` as the guest has it: the host arm measured, the GPU arm "not testable" (no CUDA
  driver), so the A/B stops after one host run (exit 9). The same work as ONE perftest
  run, not two, so it is also compared with the first perftest run alone.
- `check` over the stand-in libcuda.so.1 of tests/cuda_standin (``--standin``, needs
  cuda-python in the venv), `--mem peermem`: the GPU arm's "device memory" is host memory
  registered through the peermem route, so both arms run end to end as on a GPU machine
  (at least two repeats: four runs). This is the fair shape of the A/B; its speed says
  nothing about a GPU.

The check's budget sizes its runs (fixed-duration windows of budget / 2 / (2 x repeats)
seconds, at most 1 s or 328 MB, with at most 8 MiB in flight per QP: `measure/gate.py`;
rxe reaches the 1 s first): 20 s (the Slurm prolog in docs/check.md) for the guest form, 60 s (what
the lab tests give) for the stand-in form, whose four runs do not fit in 20 s in the
emulated guest. At equal bytes per run the full A/B measures at least two repeats of each
arm (four windows, each after a warm-up) where perftest's A/B measures two, so it takes
half of perftest's time only where its own fixed cost (interpreter, doctor, set-ups) is
well under perftest's two start-ups and the windows are short; the guest form measures
one window.

The same pair also times the A/B as an operator types it: two `ib_write_bw` runs at
perftest's own defaults (65536-byte messages, 5000 of them per run), what "run perftest
twice and compare" costs when nobody sizes it to the check.

Each timed pair runs in ABBA order (perftest first in even pairs, gdrprobe first in odd
ones, so drift favours neither); the ratio is check / perftest A/B per pair, reported as
median (range). The target is a ratio of at most 0.5.

**bench's overhead.** `gdrprobe bench --json -o FILE` in host memory with the settings
given; its JSON has `wall_s` (from the sweep's start: device listing, planning, every
run's set-up and handshakes, the windows, the rows) and `measured_s` (the sum of the rows'
measurement windows). Overhead = wall_s / measured_s - 1 (target <= 0.05), and also the
whole process from spawn to exit (doctor and interpreter included) / measured_s - 1.
Latency rows have no window in `measured_s`, so the default sweeps here have
`--no-latency`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from compare_perftest import in_abba_order   # this script's folder is on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERFTEST_PORT = 18515
MIB = 1 << 20
# The sweeps measured by --part bench, each a list of `gdrprobe bench` flags (host memory).
# "all-sizes" is the default sweep's sizes (2 B to 8 MiB) with fewer messages per size than
# the default 1000, so one sweep fits a few minutes of the emulated lab.
BENCH_SWEEPS = {
    "all-sizes": "--mem host -q 1 -n 200 --no-latency",
    "iters": "--mem host --sizes 4K,64K,1M -q 1 -n 1000 --no-latency",
    "duration": "--mem host --sizes 4K,64K,1M -q 1 -D 2 --no-latency",
}


def timed(argv: list[str], env: dict | None = None,
          timeout: float = 900) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=timeout)
    return time.monotonic() - started, done


def listening(port: int) -> bool:
    """Whether a TCP socket listens on port (from /proc/net/tcp{,6}: state 0A)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            continue
    return False


def perftest_run(device: str, gid: int, size: int | None, iters: int | None) -> float:
    """One ib_write_bw server+client run, spawn of the server to exit of both, in s; size
    and iters None: perftest's own defaults (DEF_SIZE_BW 65536 B x DEF_ITERS_WB 5000,
    src/perftest_parameters.h)."""
    base = ["ib_write_bw", "-d", device, "-x", str(gid), "-p", str(PERFTEST_PORT), "-F"]
    if size is not None:
        base += ["-s", str(size), "-n", str(iters)]
    started = time.monotonic()
    server = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not listening(PERFTEST_PORT):
        if server.poll() is not None or time.monotonic() - started > 60:
            raise RuntimeError(f"ib_write_bw server did not listen:\n{server.communicate()[0]}")
        time.sleep(0.005)
    client = subprocess.run([*base, "127.0.0.1"], capture_output=True, text=True, timeout=600)
    server_out, _ = server.communicate(timeout=600)
    elapsed = time.monotonic() - started
    if client.returncode or server.returncode:
        raise RuntimeError(f"ib_write_bw failed:\n{client.stdout}{client.stderr}\n{server_out}")
    return elapsed


def perftest_ab(device: str, gid: int, size: int, iters: int) -> dict:
    """The A/B at the check's bytes per run, and the A/B as typed (perftest's defaults)."""
    first = perftest_run(device, gid, size, iters)
    second = perftest_run(device, gid, size, iters)
    as_typed = perftest_run(device, gid, None, None) + perftest_run(device, gid, None, None)
    return {"first_s": first, "ab_s": first + second, "defaults_ab_s": as_typed}


def check_run(device: str, budget: float, size: int, env: dict | None, extra: list[str]) -> dict:
    argv = [sys.executable, "-m", "gdrprobe", "check", "-d", device, "-s", str(size),
            "--time-budget", str(budget), "--json", *extra]
    wall, done = timed(argv, env)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n"
                           f"{done.stderr}") from None
    arms = report["arms"]
    host_bw = statistics.median(arms[0]["bandwidths_gbps"])
    window = report["settings"].get("duration_s")
    runs = sum(len(arm["bandwidths_gbps"]) for arm in arms)
    return {"wall_s": wall, "in_process_s": report["placement"]["elapsed_s"],
            "exit": done.returncode, "classification": report["verdict"]["classification"],
            "runs": runs, "outcomes": [arm["outcome"] for arm in arms],
            "host_gbps": host_bw, "window_s": window,
            "details": [arm["detail"] for arm in arms if arm["outcome"] != "measured"],
            "messages": round(host_bw * 1e9 / 8 * window / size) if window else None}


def spread(values: list[float], digits: int = 2) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def check_part(args) -> None:
    forms = [("check (guest: GPU arm not testable)", None, [], args.budget)]
    if args.standin:
        sys.path.insert(0, REPO)
        from tests.cuda_standin.build import environment
        forms.append(("check over the stand-in libcuda, --mem peermem (both arms run)",
                      environment(), ["--mem", "peermem"], args.standin_budget))
    print(f"## check against a perftest A/B: {args.size} B messages, {args.pairs} ABBA pairs "
          "per form")
    print()
    for name, env, extra, budget in forms:
        if args.skip_guest_form and env is None:
            continue
        calibration = check_run(args.device, budget, args.size, env, extra)
        iters = max(5, calibration["messages"])
        perftest_run(args.device, args.gid_index, args.size, iters)   # warm-up, not counted
        print(f"### {name}, --time-budget {budget:g}")
        print(f"calibration (not counted): {calibration['runs']} run(s), window "
              f"{calibration['window_s']:.2f} s, host {calibration['host_gbps']:.3f} Gb/s "
              f"-> perftest -n {iters} per run; outcomes {calibration['outcomes']}, "
              f"exit {calibration['exit']}; {'; '.join(calibration['details'])[:300]}")
        print()
        print("| pair | order | perftest run 1 s | perftest A/B s | perftest A/B at its "
              "defaults s | check spawn-exit s | check in-process s | check runs | exit "
              "| check / A/B | check / one run | check / A/B at defaults |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        results = []
        for pair in range(args.pairs):
            # partial, not lambda: each callable holds this form's values, not the loop's
            theirs, mine = in_abba_order(
                pair, functools.partial(perftest_ab, args.device, args.gid_index, args.size, iters),
                functools.partial(check_run, args.device, budget, args.size, env, extra))
            results.append((theirs, mine))
            print(f"| {pair} | {'perftest first' if pair % 2 == 0 else 'check first'} "
                  f"| {theirs['first_s']:.2f} | {theirs['ab_s']:.2f} "
                  f"| {theirs['defaults_ab_s']:.2f} | {mine['wall_s']:.2f} "
                  f"| {mine['in_process_s']:.2f} | {mine['runs']} | {mine['exit']} "
                  f"| {mine['wall_s'] / theirs['ab_s']:.2f} "
                  f"| {mine['wall_s'] / theirs['first_s']:.2f} "
                  f"| {mine['wall_s'] / theirs['defaults_ab_s']:.2f} |", flush=True)
        print()
        print("| | median (range) |")
        print("|---|---:|")
        print(f"| perftest A/B s | {spread([t['ab_s'] for t, _ in results])} |")
        print(f"| perftest one run s | {spread([t['first_s'] for t, _ in results])} |")
        print(f"| check spawn to exit s | {spread([m['wall_s'] for _, m in results])} |")
        print(f"| check in-process s | {spread([m['in_process_s'] for _, m in results])} |")
        print(f"| check / perftest A/B | {spread([m['wall_s'] / t['ab_s'] for t, m in results])} |")
        print(f"| check / one perftest run | "
              f"{spread([m['wall_s'] / t['first_s'] for t, m in results])} |")
        print(f"| perftest A/B at its defaults s | "
              f"{spread([t['defaults_ab_s'] for t, _ in results])} |")
        print(f"| check / perftest A/B at its defaults | "
              f"{spread([m['wall_s'] / t['defaults_ab_s'] for t, m in results])} |")
        print(flush=True)


def bench_part(args) -> None:
    print(f"## bench: wall_s and spawn-to-exit over measured_s, {args.bench_repeats} repeats")
    print()
    print("| sweep | flags | rows | measured_s | wall_s | wall/measured - 1 "
          "| spawn-to-exit s | spawn/measured - 1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in args.sweeps.split(","):
        flags = shlex.split(BENCH_SWEEPS.get(name, name))
        for _ in range(args.bench_repeats):
            with tempfile.TemporaryDirectory() as scratch:
                out = os.path.join(scratch, "bench.json")
                wall, done = timed([sys.executable, "-m", "gdrprobe", "bench", "-d",
                                    args.device, *flags, "--json", "-o", out])
                if done.returncode != 0:
                    raise RuntimeError(f"bench exited {done.returncode}:\n{done.stderr}")
                with open(out) as file:
                    report = json.load(file)
            measured, inner = report["measured_s"], report["wall_s"]
            print(f"| {name} | `{shlex.join(flags)}` | {len(report['rows'])} | {measured:.2f} "
                  f"| {inner:.2f} | {inner / measured - 1:.3f} | {wall:.2f} "
                  f"| {wall / measured - 1:.3f} |", flush=True)
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("check", "bench", "all"), default="all")
    parser.add_argument("-d", "--device", default="rxe0")
    parser.add_argument("-x", "--gid-index", type=int, default=1, help="perftest's GID index")
    parser.add_argument("-s", "--size", type=int, default=MIB, help="message size (check's)")
    parser.add_argument("--budget", type=float, default=20.0,
                        help="check's --time-budget, which sizes its runs' windows")
    parser.add_argument("--pairs", type=int, default=4, help="ABBA pairs per form")
    parser.add_argument("--standin", action="store_true",
                        help="also time check over the stand-in libcuda (both arms run)")
    parser.add_argument("--standin-budget", type=float, default=60.0,
                        help="its --time-budget: four runs (two repeats) must fit in it")
    parser.add_argument("--skip-guest-form", action="store_true",
                        help="time only the stand-in form")
    parser.add_argument("--sweeps", default="all-sizes,iters,duration",
                        help=f"bench sweeps: names ({', '.join(BENCH_SWEEPS)}) or quoted flags")
    parser.add_argument("--bench-repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"# time to a verdict on {args.device}, {platform.node()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, kernel {platform.release()}, "
          f"{os.cpu_count()} CPUs")
    print()
    if args.part in ("check", "all"):
        check_part(args)
    if args.part in ("bench", "all"):
        bench_part(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
