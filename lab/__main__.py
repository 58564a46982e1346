"""python -m lab: fetch the kernel, boot guests, run commands in them.

  python -m lab kernel                         fetch and unpack the kernel (once)
  python -m lab loopback -- CMD                one guest, rxe0 on lo
  python -m lab pair --a CMD --b CMD           two guests on a virtual wire
  python -m lab demo                           the main job on the two-host lab
  python -m lab demo-slurm                     a Slurm cluster on the two-host lab
  python -m lab demo-dmabuf                    the DMA-BUF arm through the kernel's import path,
                                               over the stand-in CUDA and HIP runtimes
  python -m lab demo-rocm                      its ROCm half alone (hip-python; not GPU proof)
  python -m lab demo-platform                  data-direct's outcomes through the dma-buf path,
                                               then ACS and IOMMU read live, in one q35 guest
  python -m lab demo-rails                     all rails at once, uncapped and behind a shared
                                               uplink, in one q35 guest
  python -m lab demo-nccl-pattern              NCCL's pattern: sustained, round-trip bound on a
                                               delayed wire, a slow flush named, in one guest
  python -m lab test                           the lab test suites
"""

from __future__ import annotations

import argparse
import sys

from lab import vm
from lab.kernel import LabError, ensure_kernel
from lab.suites import (demo, demo_dmabuf, demo_nccl_pattern, demo_platform, demo_rails,
                        demo_rocm, demo_slurm, run_suites)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("kernel", help="fetch the lab kernel into the cache")
    loop = sub.add_parser("loopback", help="run a command in one guest (rxe0 on lo)")
    loop.add_argument("--timeout", type=float, default=600)
    loop.add_argument("command", nargs=argparse.REMAINDER)
    pair = sub.add_parser("pair", help="run one command in each of two wired guests")
    pair.add_argument("--timeout", type=float, default=600)
    pair.add_argument("--a", required=True, help="command for host a (10.77.0.1)")
    pair.add_argument("--b", required=True, help="command for host b (10.77.0.2)")
    sub.add_parser("demo", help="the README's main command on the two-host lab")
    sub.add_parser("demo-slurm", help="Slurm across the two guests: the prolog, the matrix, "
                                      "a drained node (docs/slurm.md)")
    sub.add_parser("demo-dmabuf", help="the A/B with --mem dmabuf through the kernel's dma-buf "
                                       "import path with host pages behind it "
                                       "(docs/dmabuf-lab.md), over the stand-in CUDA and HIP "
                                       "runtimes")
    sub.add_parser("demo-rocm", help="demo-dmabuf's ROCm half alone: the A/B over the stand-in "
                                     "HIP runtime under hip-python (not GPU proof)")
    sub.add_parser("demo-platform", help="NCCL's outcomes on a data-direct NIC through the dma-buf "
                                         "path, then the doctor's ACS and IOMMU checks read live, in "
                                         "one q35 guest (docs/dmabuf-lab.md, docs/doctor.md)")
    sub.add_parser("demo-rails", help="check --node --all-rails on two Soft-RoCE rails under one "
                                      "PCIe switch, uncapped and behind a shared uplink, in one "
                                      "q35 guest (docs/lab.md)")
    sub.add_parser("demo-nccl-pattern", help="NCCL's pattern: sustained without delay, "
                                             "round-trip bound on a delayed wire, a slow flush "
                                             "named, in one loopback guest (docs/lab.md)")
    tests = sub.add_parser("test", help="run the lab test suites in guests")
    tests.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k NAME)")
    args = parser.parse_args(argv)

    try:
        if args.action == "kernel":
            print(ensure_kernel())
            return 0
        if args.action == "loopback":
            command = " ".join(a for a in args.command if a != "--")
            result = vm.run_loopback(command, args.timeout)
            vm.print_result(result)
            return result.returncode
        if args.action == "pair":
            results = vm.run_pair(args.a, args.b, args.timeout)
            for result in results:
                vm.print_result(result)
            return max(r.returncode for r in results)
        if args.action == "demo":
            return demo()
        if args.action == "demo-slurm":
            return demo_slurm()
        if args.action == "demo-dmabuf":
            return demo_dmabuf()
        if args.action == "demo-rocm":
            return demo_rocm()
        if args.action == "demo-platform":
            return demo_platform()
        if args.action == "demo-rails":
            return demo_rails()
        if args.action == "demo-nccl-pattern":
            return demo_nccl_pattern()
        return run_suites(args.pytest_args)
    except LabError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
