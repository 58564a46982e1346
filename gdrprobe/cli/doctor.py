"""``gdrprobe doctor`` and ``gdrprobe capture``: diagnose a machine, or record it for later.

doctor exits 0 when no finding failed and 1 (VERDICT_NOT_OK) when one did; warnings, skips
and infos do not change it. A check that crashed (a gdrprobe bug) alone exits 70 (INTERNAL).
"""

from __future__ import annotations

import sys

import gdrprobe


def _doctor(args) -> int:
    from gdrprobe.report.model import to_json
    from gdrprobe.report.text import render_doctor

    report = gdrprobe.diagnose(args.root, nccl=args.nccl)
    sys.stdout.write(to_json(report) + "\n" if args.json else render_doctor(report))
    return report.exit_code


def _capture(args) -> int:
    copied = gdrprobe.capture(args.dest, root=args.root, replace=args.replace, nccl=args.nccl)
    print(f"captured {len(copied)} paths into {args.dest}; "
          f"replay with: gdrprobe doctor --root {args.dest}")
    return 0


def add_nccl_flag(parser) -> None:
    parser.add_argument("--nccl", metavar="PATH",
                        help="the libnccl the job loads (librccl on an AMD node), or the job's Python (its "
                             "interpreter, virtual environment or site-packages); default: found as the loader "
                             "finds it (LD_LIBRARY_PATH, the NCCL wheel of VIRTUAL_ENV/CONDA_PREFIX, ld.so.cache)")


def register(subparsers) -> None:
    doctor = subparsers.add_parser(
        "doctor", help="check every GPUDirect RDMA prerequisite and name the fix",
        description="Read sysfs, procfs and the drivers (changing nothing) and report, in the "
                    "order of the diagnosis flowchart, what stops GPUDirect RDMA. "
                    "Exit code 0: no failure; 1: at least one check failed; 70: only a "
                    "check that crashed (a bug in gdrprobe) failed.",
        epilog="example: gdrprobe doctor --root /tmp/node17 (replay a capture)")
    doctor.add_argument("--root", default="/", metavar="PATH",
                        help="diagnose a capture ('gdrprobe capture') or another machine's "
                             "root (with sys/ and proc/) instead of this machine (default: /)")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    add_nccl_flag(doctor)
    doctor.set_defaults(handler=_doctor)

    capture = subparsers.add_parser(
        "capture", help="copy the files the doctor reads, for a reproducible bug report",
        description="Copy exactly the /sys and /proc files the doctor reads (plus the NCCL_, "
                    "CUDA_, MLX5_, UCX_ environment and CUDA driver facts) into DEST.",
        epilog="example: gdrprobe capture /tmp/node17, then gdrprobe doctor --root /tmp/node17")
    capture.add_argument("dest", metavar="DEST",
                         help="a new or empty directory (a capture is never merged into "
                              "other files)")
    capture.add_argument("--replace", action="store_true",
                         help="replace the earlier capture in DEST (only a capture is replaced)")
    capture.add_argument("--root", default="/", metavar="PATH",
                         help="capture from this root instead of / (default: /)")
    add_nccl_flag(capture)
    capture.set_defaults(handler=_capture)
