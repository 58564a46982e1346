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
import select
import sys
import traceback

from gdrprobe import __version__
from gdrprobe.cli.common import to_stderr
from gdrprobe.cli.signals import INTERRUPTS
from gdrprobe.errors import SCHEDULER_ACTION, ExitCode, GdrprobeError


class UsageExit(SystemExit):
    """argparse's refusal of a command line (exit 2, as argparse exits), with its message, so
    that :func:`main` can put it in the error document of ``--json``."""

    def __init__(self, prog: str, message: str):
        super().__init__(int(ExitCode.USAGE))
        self.prog = prog
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing an argument a command does not take with that command's
    usage (argparse's own names the top level's), and a perftest spelling with gdrprobe's
    equivalent (:mod:`gdrprobe.cli.perftest`); a refusal is a :class:`UsageExit`, written
    as the command's error texts are (its ``render_error``, below) where it has its own."""

    command_line: list[str] = []       # what is being parsed, for a refusal's render_error

    def parse_args(self, args=None, namespace=None):
        from gdrprobe.cli.perftest import perftest_hint

        Parser.command_line = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = perftest_hint(extras)
            self.command_parser(parsed).error(
                f"unrecognized arguments: {' '.join(extras)}" + (f"\n  {hint}" if hint else ""))
        return parsed

    def command_parser(self, parsed) -> argparse.ArgumentParser:
        """The parser of the command parsed (this one where there is none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(getattr(parsed, action.dest, None), self)
        return self

    def error(self, message: str):
        text = f"{self.prog}: error: {message}"
        render = self._defaults.get(RENDER_ERROR)
        if render is None:
            self.print_usage(sys.stderr)
            print(text, file=sys.stderr)
        else:
            print(render(self.command_line, int(ExitCode.USAGE), self.format_usage() + text,
                         message, ""), file=sys.stderr)
        raise UsageExit(self.prog, message)


# A command whose text has a contract on every path (check: the exit line, --quiet's one
# line) sets this default to render_error(parsed, code, message, cause, fix) -> the text
# to print for an error; parsed: its arguments, or the command line argparse refused.
RENDER_ERROR = "render_error"


def build_parser() -> argparse.ArgumentParser:
    from gdrprobe.cli import bench, check, cluster, devices, doctor, nccl_log, run, serve

    parser = Parser(
        prog="gdrprobe",
        description="Prove whether GPUDirect RDMA is engaged, in one process.",
    )
    parser.add_argument("--version", action="version", version=f"gdrprobe {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (devices, serve, run, doctor, nccl_log, check, bench, cluster):
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command's exit code. SIGTERM cleans up as Ctrl-C does, and exits 143 where Ctrl-C
    exits 130; with --json an error prints its document on stdout too (cli.common); output
    whose reader went away (a pipe into head) ends the command quietly with 141."""
    args = None
    INTERRUPTS.install()
    try:
        # Building the parser imports the commands; parsing may format a help text that
        # loads the native extension (common.Range): a failure there is a bug too.
        args = build_parser().parse_args(argv)
        code = INTERRUPTS.exit_code(int(args.handler(args)))
        sys.stdout.flush()      # a closed pipe is met here, not at the interpreter's exit
        return code
    except UsageExit as refused:
        try:
            json_error(args, argv, int(ExitCode.USAGE), refused.message, command=refused.prog)
        except BrokenPipeError:
            raise SystemExit(closed_output()) from None
        raise
    except SystemExit:          # --help, --version
        if not flushed():
            raise SystemExit(closed_output()) from None
        raise
    except BrokenPipeError as error:
        if output_closed():
            return closed_output()
        return failed(args, argv, ExitCode.INTERNAL, internal_error_message(error),
                      internal_error_cause(error), where(error), REPORT_FIX)
    except GdrprobeError as error:
        return failed(args, argv, INTERRUPTS.exit_code(int(error.exit_code)),
                      f"gdrprobe: error: {error}", error.cause, error.evidence, error.fix,
                      error=error)
    except KeyboardInterrupt:
        return failed(args, argv, INTERRUPTS.exit_code(int(ExitCode.INTERRUPTED)),
                      f"gdrprobe: {INTERRUPTS.what()}; everything was released",
                      INTERRUPTS.what())
    except Exception as error:   # noqa: BLE001 - a bug must never read as a node fault
        return failed(args, argv, ExitCode.INTERNAL, internal_error_message(error),
                      internal_error_cause(error), where(error), REPORT_FIX)
    finally:
        INTERRUPTS.restore()


def failed(args, argv, code: int, message: str, cause: str, evidence: str = "", fix: str = "",
           error: GdrprobeError | None = None) -> int:
    """An error's message on stderr (as the command renders its errors, where it does:
    RENDER_ERROR) and, with --json, its document on stdout; returns its exit code (141
    where the output is gone)."""
    render = getattr(args, RENDER_ERROR, None)
    if render is not None:
        message = render(args, int(code), message, cause, fix)
    try:
        to_stderr(message)
        json_error(args, argv, int(code), cause, evidence, fix, error=error)
        sys.stdout.flush()
    except BrokenPipeError:
        return closed_output()
    return int(code)


def json_error(args, argv, code: int, cause: str, evidence: str = "", fix: str = "",
               command: str = "", error: GdrprobeError | None = None) -> None:
    """With --json (parsed, or on a command line argparse refused), the error's document
    (:func:`gdrprobe.cli.common.print_error_document`)."""
    wanted = getattr(args, "json", False) if args is not None else \
        "--json" in (sys.argv[1:] if argv is None else argv)
    if not wanted:
        return
    try:
        from gdrprobe.cli.common import print_error_document
    except ImportError:          # a broken install: the message on stderr is all there is
        return
    print_error_document(command or getattr(args, "command", "") or "", code, cause,
                         evidence, fix, error=error)


# ---- a closed pipe (SIGTERM as Ctrl-C: cli/signals.py) --------------------------------------


def output_closed() -> bool:
    """Whether stdout or stderr lost its reader: the write end of a pipe whose reader is gone
    polls POLLERR (Linux fs/pipe.c pipe_poll), a socket's POLLHUP. A BrokenPipeError from
    anything else (a socket of the out-of-band channel) is not a closed output."""
    return any(_lost_reader(stream) for stream in (sys.stdout, sys.stderr))


def _lost_reader(stream) -> bool:
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):    # not a file: a test's capture
        return False
    poller = select.poll()
    poller.register(descriptor, 0)                   # POLLERR and POLLHUP are always asked
    return any(events & (select.POLLERR | select.POLLHUP)
               for _, events in poller.poll(0))


def flushed() -> bool:
    """stdout flushed; False where its reader is gone."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return False
    return True


def closed_output() -> int:
    """The output's reader went away (``gdrprobe ... | head``): stop quietly with 141, as a
    Unix tool that SIGPIPE ends (128 + 13), never as a bug (70). SIGPIPE itself stays ignored
    (Python's start-up sets SIG_IGN): with its default action any closed socket would kill
    gdrprobe mid-run (Python's signal documentation, "Note on SIGPIPE"). What is left in
    the buffers goes to /dev/null, so the interpreter's last flush fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        if _lost_reader(stream):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    return int(ExitCode.BROKEN_PIPE)


TRACEBACK_ENV = "GDRPROBE_TRACEBACK"   # set to 1 for the whole traceback of an internal error


REPORT_FIX = ("report it to gdrprobe's issue tracker with this message and the whole "
              f"traceback ({TRACEBACK_ENV}=1 prints it)")


def internal_error_cause(error: BaseException) -> str:
    return f"internal error: {type(error).__name__}: {error}"


def internal_error_message(error: BaseException) -> str:
    """An exception gdrprobe did not expect, said as a bug of gdrprobe (not the node's): what,
    where (the innermost frame in gdrprobe's own code), and how to report it."""
    lines = [f"gdrprobe: {internal_error_cause(error)}",
             f"  at {where(error)}",
             f"  this is a bug in gdrprobe {__version__}, not a fault of this node (exit "
             f"{int(ExitCode.INTERNAL)}: {SCHEDULER_ACTION[ExitCode.INTERNAL]})",
             f"  please {REPORT_FIX}"]
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
