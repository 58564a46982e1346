"""The command line: a thin face over the public API (``gdrprobe``), one subcommand per
use, each registered by the module that owns it.

A subcommand module provides ``register(subparsers)``, which adds its parser and sets
``handler`` to a function taking the parsed arguments and returning an exit code. The
handlers call only the public API and render what it returns (gdrprobe.report); this
module only dispatches and turns :class:`GdrprobeError` into a message and exit code.

Importing this module imports no command: :func:`main` does, inside its error handling, so
a command module that fails to import (a broken install, a bad edit) is an internal error
(exit 70, warn) like any other bug, never Python's exit 1, which a prolog reads as "drain".
Both entry points, the ``gdrprobe`` console script and ``python -m gdrprobe``, are this
:func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from gdrprobe import __version__
from gdrprobe.errors import SCHEDULER_ACTION, ExitCode, GdrprobeError


def build_parser() -> argparse.ArgumentParser:
    from gdrprobe.cli import bench, check, cluster, devices, doctor, nccl_log, run, serve

    parser = argparse.ArgumentParser(
        prog="gdrprobe",
        description="Prove whether GPUDirect RDMA is engaged, in one process.",
    )
    parser.add_argument("--version", action="version", version=f"gdrprobe {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (devices, serve, run, doctor, nccl_log, check, bench, cluster):
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        # Building the parser imports the commands; parsing may format a help text that
        # loads the native extension (common.Range): a failure there is a bug too.
        args = build_parser().parse_args(argv)
        return int(args.handler(args))
    except GdrprobeError as error:
        print(f"gdrprobe: error: {error}", file=sys.stderr)
        return int(error.exit_code)
    except KeyboardInterrupt:
        print("gdrprobe: interrupted; everything was released", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except Exception as error:   # noqa: BLE001 - a bug must never read as a node fault
        print(internal_error_message(error), file=sys.stderr)
        return int(ExitCode.INTERNAL)


TRACEBACK_ENV = "GDRPROBE_TRACEBACK"   # set to 1 for the whole traceback of an internal error


def internal_error_message(error: BaseException) -> str:
    """An exception gdrprobe did not expect, said as a bug of gdrprobe (not the node's): what,
    where (the innermost frame in gdrprobe's own code), and how to report it."""
    lines = [f"gdrprobe: internal error: {type(error).__name__}: {error}",
             f"  at {where(error)}",
             f"  this is a bug in gdrprobe {__version__}, not a fault of this node (exit "
             f"{int(ExitCode.INTERNAL)}: {SCHEDULER_ACTION[ExitCode.INTERNAL]})",
             "  please report it to gdrprobe's issue tracker with this message and the whole "
             f"traceback ({TRACEBACK_ENV}=1 prints it)"]
    if os.environ.get(TRACEBACK_ENV) == "1":
        lines.append("".join(traceback.format_exception(type(error), error,
                                                        error.__traceback__)).rstrip())
    return "\n".join(lines)


def where(error: BaseException) -> str:
    """file:line in function of the innermost frame in gdrprobe's own code (else the
    innermost frame), the file named from the package's root."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if frame.filename.startswith(PACKAGE_DIR + os.sep)]
    if not frames:
        return "an unknown place"
    frame = (own or frames)[-1]
    name = (os.path.relpath(frame.filename, os.path.dirname(PACKAGE_DIR)) if own
            else frame.filename)
    return f"{name}:{frame.lineno} in {frame.name}"


PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # .../gdrprobe
