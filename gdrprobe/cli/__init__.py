"""The command line: a thin face over the public API (``gdrprobe``), one subcommand per
use, each registered by the module that owns it.

A subcommand module provides ``register(subparsers)``, which adds its parser and sets
``handler`` to a function taking the parsed arguments and returning an exit code. The
handlers call only the public API and render what it returns (gdrprobe.report); this
module only dispatches and turns :class:`GdrprobeError` into a message and exit code.
"""

from __future__ import annotations

import argparse
import sys

from gdrprobe import __version__
from gdrprobe.cli import bench, check, cluster, devices, doctor, nccl_log, run, serve
from gdrprobe.errors import ExitCode, GdrprobeError

COMMAND_MODULES = (devices, serve, run, doctor, nccl_log, check, bench, cluster)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gdrprobe",
        description="Prove whether GPUDirect RDMA is engaged, in one process.",
    )
    parser.add_argument("--version", action="version", version=f"gdrprobe {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except GdrprobeError as error:
        print(f"gdrprobe: error: {error}", file=sys.stderr)
        return int(error.exit_code)
    except KeyboardInterrupt:
        print("gdrprobe: interrupted; everything was released", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
