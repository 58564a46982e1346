"""Flags shared by the commands, named as perftest names them, and their mapping onto the
public API's arguments.

A flag the user did not give is passed on as None (or not at all), so the public API and
:mod:`gdrprobe.defaults` alone decide every default; the help texts quote that table.
"""

from __future__ import annotations

import argparse
import os
import sys

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.signals import INTERRUPTS
from gdrprobe.errors import quoted
from gdrprobe.numbers import decimal, integer, is_decimal, real

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def whole(text: str) -> int:
    """An argparse type: a whole number as a person and C write it, ASCII digits and a sign
    (``int()`` also takes ``1_000``, blanks and other scripts' digits), saturated at the
    int64 range (the API says where a setting's own range ends)."""
    value = integer(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number such as 4 or 100")
    return value


def real_number(text: str) -> float:
    """An argparse type: a finite number as a person writes it (0.9, 30, 1e-3; not 1_000,
    nan, inf or fullwidth digits, which ``float()`` takes)."""
    value = real(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a number such as 0.9 or 30")
    return value


def size(text: str) -> int:
    """An argparse type: a size in bytes, with K, M or G for powers of 1024 (4096, 64K, 1M):
    the one spelling of a size that every command takes."""
    item = text.strip().upper()
    number, unit = (item[:-1], item[-1]) if item[-1:] in ("K", "M", "G") else (item, "")
    if not is_decimal(number) or decimal(number) == 0:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a size such as 4096, 64K or 1M")
    return decimal(number) * SIZE_UNITS[unit]


def size_list(text: str) -> tuple[int, ...]:
    """An argparse type: sizes as :func:`size` reads them, comma-separated."""
    return tuple(size(part) for part in text.split(","))


class Range:
    """A setting's valid range in a help text (``%(range)s``), read from where the range is
    defined (:func:`gdrprobe.limits`: the run engine's bounds, the C loop's) only when the
    help is printed, so building the parser loads no native code."""

    def __init__(self, setting: str, unit: str = ""):
        self.setting = setting
        self.unit = unit

    def __str__(self) -> str:
        try:
            low, high = gdrprobe.limits()[self.setting]
        except ImportError:          # the native extension is not built: nothing can run
            return "a range the native extension sets (not built here)"
        return f"{low:g} to {high:g}{self.unit}"


def with_range(action: argparse.Action, setting: str, unit: str = "") -> argparse.Action:
    """The action, its help's ``%(range)s`` bound to the setting's valid range."""
    action.range = Range(setting, unit)
    return action


def add_qps_flag(parser, *, several: bool, default_text: str) -> None:
    """-q/--qp as perftest names it: the number of QPs (bench: a list of them)."""
    what = "QP counts, e.g. 1,4, each" if several else "number of QPs,"
    with_range(parser.add_argument(
        "-q", "--qp", dest="qps", type=int_list if several else whole,
        default=(defaults.QPS,) if several else None, metavar="LIST" if several else "N",
        help=f"{what} %(range)s ({default_text})"), "qps")


def add_opcode_flag(parser) -> None:
    """--opcode: the RDMA operation measured, as perftest's ib_write_* and ib_read_* differ."""
    parser.add_argument("--opcode", choices=defaults.OPCODES, default=defaults.OPCODE,
                        help="write (default): RDMA WRITE into the peer's buffer, as "
                             "perftest's ib_write_bw/ib_write_lat; read: RDMA READ from it, "
                             "as ib_read_bw/ib_read_lat (the peer's NIC reads its memory)")


def add_bidir_flag(parser, what: str) -> None:
    """-b/--bidir, perftest's spelling: both sides post at once in one timed window."""
    parser.add_argument("-b", "--bidir", action="store_true",
                        help="both directions at once, as perftest's -b: each side WRITEs "
                             "into the other's buffer in one window, every message checked "
                             f"both ways (run: unless --sample-integrity); {what}")


def int_list(text: str) -> tuple[int, ...]:
    """An argparse type: whole numbers, comma-separated."""
    numbers = tuple(integer(part) for part in text.split(","))
    if None in numbers:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a list of numbers such as 1,2,4")
    return numbers


def add_endpoint_flags(parser) -> None:
    add_device_flags(parser)
    parser.add_argument("-p", "--port", type=tcp_port, metavar="TCP_PORT",
                        help=f"out-of-band TCP port (default {defaults.PORT})")
    parser.add_argument("--token", help=f"the run's token (default: ${gdrprobe.TOKEN_ENV})")
    add_timeout_flag(parser)


def add_timeout_flag(parser) -> None:
    with_range(parser.add_argument(
        "--timeout", type=real_number, default=defaults.TIMEOUT_S, metavar="SECONDS",
        help=f"time-out of every out-of-band step, %(range)s (default {defaults.TIMEOUT_S:g})"),
        "timeout_s", " s")


def add_device_flags(parser, device_default: str = "the first one",
                     gid_default: str = "the RoCE v2 GID of the address used to reach the "
                                        "peer") -> None:
    """-d, -i and -x as perftest names them; the help says the command's own defaults."""
    parser.add_argument("-d", "--ib-dev", dest="device", metavar="DEVICE",
                        help=f"RDMA device (default: {device_default})")
    parser.add_argument("-i", "--ib-port", dest="ib_port", type=whole, default=1, metavar="PORT",
                        help="device port (default 1)")
    parser.add_argument("-x", "--gid-index", dest="gid_index", type=whole, metavar="INDEX",
                        help=f"GID index (default: {gid_default})")


def add_verdict_flags(parser, repeats_help: str | None) -> None:
    """--threshold, and --repeats where the command repeats the A/B (repeats_help says how)."""
    if repeats_help is not None:
        parser.add_argument("--repeats", type=whole, default=defaults.REPEATS,
                            help=f"{repeats_help} (default {defaults.REPEATS})")
    parser.add_argument("--threshold", type=real_number, default=defaults.THRESHOLD,
                        help="GPU/host bandwidth ratio that counts as engaged (default "
                             f"{defaults.THRESHOLD:g})")


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535 (a larger number would wrap around)."""
    port = decimal(text, 65536)
    if port is None or not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a TCP port (1 to 65535)")
    return port


def to_stderr(text: str) -> None:
    """text and its newline in one write: where ranks share one stderr (mpirun, srun) a
    print's two writes let another rank's message land before this one's newline."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def notice(text: str) -> None:
    """A line for the person at the terminal while a command runs."""
    to_stderr(f"gdrprobe: {text}")


def endpoint_arguments(args) -> dict:
    """The public API's device arguments from the device flags."""
    return {"device": args.device, "ib_port": args.ib_port, "gid_index": args.gid_index}


def token_from(args) -> str | None:
    """--token, else $GDRPROBE_TOKEN (the public API refuses a weak one, with the reason)."""
    return args.token or os.environ.get(gdrprobe.TOKEN_ENV)


def terminate_as_interrupt() -> None:
    """SIGTERM (a job scheduler, kill) cleans up exactly like Ctrl-C; the exit code says
    which it was (cli.signals.Interrupts: 143, not 130). cli.main already catches it for
    every command; a command that installed another handler on the way calls this again."""
    INTERRUPTS.catch_sigterm()


# ---- --json: one document, errors included -------------------------------------------------

DOCUMENT_PRINTED = "json_document_printed"   # on an error whose command printed a document


def printed_document(error: BaseException) -> BaseException:
    """Mark an error whose command already printed its --json document for it (a run's
    partial-run document): no second document follows."""
    setattr(error, DOCUMENT_PRINTED, True)
    return error


def print_error_document(command: str, code: int, cause: str, evidence: str = "",
                         fix: str = "", error: BaseException | None = None) -> None:
    """The one JSON document of a --json command that ended in an error instead of its
    report (:class:`gdrprobe.report.model.ErrorReport`, docs/json.md), on stdout, unless
    the command printed its own for this error (:func:`printed_document`)."""
    from gdrprobe.errors import SCHEDULER_ACTION
    from gdrprobe.report.model import ErrorReport, to_json

    if getattr(error, DOCUMENT_PRINTED, False):
        return
    print(to_json(ErrorReport(command.removeprefix("gdrprobe").strip(), int(code),
                              SCHEDULER_ACTION[int(code)],
                              cause, evidence, fix)), flush=True)


def add_memory_flags(parser, remote: bool, default: str = "host") -> None:
    """--mem (default: the command's own, which the help states), the GPU and buffer flags,
    and --remote-mem where the command asks a server for its buffer."""
    parser.add_argument("--mem", default=default, choices=defaults.MEM_CHOICES,
                        help="this side's buffer: host, or a GPU buffer registered through "
                             "DMA-BUF or nvidia-peermem (gpu: choose automatically) or "
                             f"staged through host memory (default {default})")
    if remote:
        parser.add_argument("--remote-mem", choices=defaults.MEM_CHOICES,
                            help="ask the server for this kind of buffer (default: the "
                                 "server's own --mem)")
    parser.add_argument("--gpu", default="0", metavar="ORDINAL|BUS_ID",
                        help="the GPU: CUDA ordinal or full PCI bus id such as 0000:3b:00.0 "
                             "(bus ids do not move; ordinals can; default 0)")
    parser.add_argument("--gpu-mem-type", default=defaults.GPU_MEMORY_TYPE,
                        choices=defaults.GPU_MEMORY_TYPES,
                        help="GPU memory type; managed and pinned-host are no GPUDirect proof "
                             f"(default {defaults.GPU_MEMORY_TYPE})")
    parser.add_argument("--dmabuf-pcie", action="store_true",
                        help="export DMA-BUF with the PCIe (BAR1) mapping flag (driver >= 12.8)")
    parser.add_argument("--huge-pages", action="store_true",
                        help="host buffers on 2 MiB huge pages")
    parser.add_argument("--gpu-alloc", default=defaults.GPU_ALLOCATION,
                        choices=defaults.GPU_ALLOCATIONS,
                        help="how GPU device memory is allocated: vmm (cuMemCreate and "
                             "cuMemMap, as NCCL allocates its buffers; cuMemAlloc where the "
                             "driver or GPU lacks VMM, as NCCL does) or malloc (cuMemAlloc) "
                             f"(default {defaults.GPU_ALLOCATION})")


def memory_arguments(args) -> dict:
    """The public API's memory arguments from the memory flags."""
    return {"mem": args.mem, "gpu": args.gpu, "gpu_mem_type": args.gpu_mem_type,
            "pcie_mapping": args.dmabuf_pcie, "huge_pages": args.huge_pages,
            "gpu_alloc": args.gpu_alloc}
