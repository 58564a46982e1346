"""The command line: one subcommand per use, each registered by the module that owns it.

A subcommand module provides ``register(subparsers)``, which adds its parser and sets
``handler`` to a function taking the parsed arguments and returning an exit code. This
module only dispatches and turns :class:`GdrprobeError` into a message and exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gdrprobe import __version__
from gdrprobe.errors import ExitCode, GdrprobeError

COMMAND_MODULES = (
    "gdrprobe.cli.devices",
    "gdrprobe.cli.serve",
    "gdrprobe.cli.run",
    "gdrprobe.cli.doctor",
    "gdrprobe.cli.nccl_log",
    "gdrprobe.cli.check",
    "gdrprobe.cli.bench",
    "gdrprobe.cli.cluster",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gdrprobe",
        description="Prove whether GPUDirect RDMA is engaged, in one process.",
    )
    parser.add_argument("--version", action="version", version=f"gdrprobe {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
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
