"""gdrprobe devices: the RDMA devices, their ports and GID tables."""

from __future__ import annotations

import gdrprobe
from gdrprobe.report.model import to_json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "devices", help="list RDMA devices, ports and GIDs",
        description="List every RDMA device with its ports and GID table.",
        epilog="example: gdrprobe devices -d mlx5_0 --json")
    parser.add_argument("-d", "--ib-dev", "--device", dest="device", metavar="DEVICE",
                        help="only this device, e.g. mlx5_0 (default: every device; "
                             "--device is the former spelling, still accepted)")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from gdrprobe.report.text import render_devices

    report = gdrprobe.list_devices(args.device)
    print(to_json(report) if args.json else render_devices(report))
    return 0
