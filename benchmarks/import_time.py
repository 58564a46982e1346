"""How long `import gdrprobe` takes in a fresh interpreter (issue 12's budget: 50 ms).

Each sample is a new process, so nothing is cached in memory between them; the time is the
import alone, measured inside the process, and the interpreter's own start is excluded.

    .venv/bin/python benchmarks/import_time.py [--samples 21]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

PROBE = ("import time; t = time.perf_counter(); import gdrprobe; "
         "print(time.perf_counter() - t)")


def sample() -> float:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True).stdout
    return float(out) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=21)
    args = parser.parse_args()
    times = sorted(sample() for _ in range(args.samples))
    print(f"# import gdrprobe on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"Python {platform.python_version()}, {args.samples} fresh processes")
    print(f"median {statistics.median(times):.1f} ms, min {times[0]:.1f} ms, "
          f"max {times[-1]:.1f} ms (budget 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
