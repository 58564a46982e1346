"""Flags shared by the commands that open an RDMA endpoint, named as perftest names them."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from gdrprobe.errors import UsageError
from gdrprobe.protocol.channel import token_warning

TOKEN_ENV = "GDRPROBE_TOKEN"


def add_endpoint_flags(parser) -> None:
    add_device_flags(parser)
    parser.add_argument("-p", "--port", type=tcp_port, metavar="TCP_PORT",
                        help="out-of-band TCP port (default 18750)")
    parser.add_argument("--token", help=f"the run's token (default: ${TOKEN_ENV})")
    add_timeout_flag(parser)


def add_timeout_flag(parser) -> None:
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="time-out of every out-of-band step (default 30)")


def add_device_flags(parser) -> None:
    parser.add_argument("-d", "--ib-dev", dest="device", metavar="DEVICE",
                        help="RDMA device (default: the first one)")
    parser.add_argument("-i", "--ib-port", dest="ib_port", type=int, default=1, metavar="PORT",
                        help="device port (default 1)")
    parser.add_argument("-x", "--gid-index", dest="gid_index", type=int, metavar="INDEX",
                        help="GID index (default: the RoCE v2 GID of the address used to "
                             "reach the peer)")


def add_verdict_flags(parser, repeats_help: str | None) -> None:
    """--threshold, and --repeats where the command repeats the A/B (repeats_help says how)."""
    from gdrprobe.report.model import DEFAULT_THRESHOLD

    if repeats_help is not None:
        parser.add_argument("--repeats", type=int, default=3,
                            help=f"{repeats_help} (default 3)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="GPU/host bandwidth ratio that counts as engaged (default "
                             f"{DEFAULT_THRESHOLD:g})")


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535 (a larger number would wrap around)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return port


def notice(text: str) -> None:
    """A line for the person at the terminal while a command runs."""
    print(f"gdrprobe: {text}", file=sys.stderr, flush=True)


def endpoint_options(args):
    from gdrprobe.rdma.endpoint import EndpointOptions

    if not 1 <= args.ib_port <= 255:
        raise UsageError(f"--ib-port {args.ib_port} is not a port number", "use 1 or 2")
    return EndpointOptions(device=args.device, port=args.ib_port, gid_index=args.gid_index)


def token_from(args, required: bool) -> str | None:
    token = args.token or os.environ.get(TOKEN_ENV)
    if required and not token:
        raise UsageError("no token: the server only talks to clients that know its token",
                         f"pass --token TOKEN (printed by 'gdrprobe serve') or set {TOKEN_ENV}")
    if token is not None and not 8 <= len(token) <= 256:
        raise UsageError("the token must be 8 to 256 characters", "use the one the server printed")
    if token is not None and token_warning(token):
        notice(f"warning: {token_warning(token)}")
    return token


def terminate_as_interrupt() -> None:
    """SIGTERM (a job scheduler, kill) cleans up exactly like Ctrl-C."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def add_memory_flags(parser, remote: bool, default: str = "host") -> None:
    """--mem (default: the command's own, which the help states), the GPU and buffer flags,
    and --remote-mem where the command asks a server for its buffer."""
    from gdrprobe.memory.spec import MEM_CHOICES, MEMORY_TYPES

    parser.add_argument("--mem", default=default, choices=MEM_CHOICES,
                        help="this side's buffer: host, or a GPU buffer registered through "
                             "DMA-BUF or nvidia-peermem (gpu: choose automatically) or "
                             f"staged through host memory (default {default})")
    if remote:
        parser.add_argument("--remote-mem", choices=MEM_CHOICES,
                            help="ask the server for this kind of buffer (default: the "
                                 "server's own --mem)")
    parser.add_argument("--gpu", default="0", metavar="ORDINAL|BUS_ID",
                        help="the GPU: CUDA ordinal or full PCI bus id such as 0000:3b:00.0 "
                             "(bus ids do not move; ordinals can)")
    parser.add_argument("--gpu-mem-type", default="device", choices=MEMORY_TYPES,
                        help="GPU memory type; managed and pinned-host are no GPUDirect proof")
    parser.add_argument("--dmabuf-pcie", action="store_true",
                        help="export DMA-BUF with the PCIe (BAR1) mapping flag (driver >= 12.8)")
    parser.add_argument("--huge-pages", action="store_true",
                        help="host buffers on 2 MiB huge pages")


def memory_spec(args, choice: str):
    from gdrprobe.memory.spec import MemorySpec

    return MemorySpec.from_choice(choice, gpu=args.gpu, memory_type=args.gpu_mem_type,
                                  pcie_mapping=args.dmabuf_pcie, huge_pages=args.huge_pages)
