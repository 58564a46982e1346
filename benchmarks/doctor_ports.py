"""The doctor's time on a node whose RDMA device has many ports (issue 43 item 5: 800 ports
took 8.7 s, 3,000 over 25 s; each port is a network device to NCCL). The node is the unit
tests' eight-GPU fixture (tests/unit/doctor/nccl_machines.hgx_8gpu_4nic) replayed from a
scratch directory, its first NIC given PORTS ports; each run is a fresh process, timed from
the doctor's call to its report (the tree is written before).

    .venv/bin/python benchmarks/doctor_ports.py [--ports 100 800 3000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONE_RUN = """
import sys, time
sys.path.insert(0, {root!r})
from tests.unit.doctor import nccl_machines
from gdrprobe.doctor.runner import run_doctor
tree = nccl_machines.hgx_8gpu_4nic({base!r})
for port in range(2, {ports} + 1):
    for name, value in (("state", "4: ACTIVE"), ("rate", "400 Gb/sec (4X NDR)"), ("link_layer", "InfiniBand")):
        tree.write(f"/sys/class/infiniband/mlx5_0/ports/{{port}}/{{name}}", value)
started = time.perf_counter()
report = run_doctor({base!r}, environ={{}})
print(time.perf_counter() - started, len(report.findings))
"""


def one_run(ports: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run([sys.executable, "-c", ONE_RUN.format(root=ROOT, base=scratch, ports=ports)],
                              capture_output=True, text=True, check=True, timeout=600)
    return float(done.stdout.split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ports", type=int, nargs="+", default=[100, 800, 3000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    for ports in args.ports:
        times = [one_run(ports) for _ in range(args.runs)]
        print(f"{ports} ports: median {statistics.median(times):.2f} s "
              f"({min(times):.2f}-{max(times):.2f}, {args.runs} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
