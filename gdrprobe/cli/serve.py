"""gdrprobe serve: lend a scratch buffer to authenticated clients, one run at a time."""

from __future__ import annotations

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.common import (add_endpoint_flags, add_memory_flags, endpoint_arguments,
                                 memory_arguments, terminate_as_interrupt, token_from)
from gdrprobe.cli.common import whole


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="wait for 'gdrprobe run' clients",
        description="Serve probe runs, one after another, to clients that know the token.",
        epilog="example: gdrprobe serve -d mlx5_0 --mem gpu (then, on the other host: "
               "GDRPROBE_TOKEN=... gdrprobe run THIS_HOST -d mlx5_0)")
    add_endpoint_flags(parser)
    add_memory_flags(parser, remote=False)
    parser.add_argument("--bind", default=defaults.BIND, metavar="ADDRESS",
                        help="IP address to listen on; its RoCE v2 GID is the one used "
                             f"(default {defaults.BIND}: every interface)")
    parser.add_argument("--once", action="store_true", help="exit after one run")
    parser.add_argument("--max-buffer", type=whole, default=defaults.MAX_BUFFER, metavar="BYTES",
                        help="the most memory one run may make this server allocate: its "
                             "registered buffer (the slots of the largest message size and "
                             "one message past them) and its QPs' and CQ's queues (default "
                             f"{defaults.MAX_BUFFER >> 20} MiB)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    terminate_as_interrupt()
    token = token_from(args) or gdrprobe.new_token()
    server = gdrprobe.server(token, bind=args.bind, port=args.port, timeout_s=args.timeout,
                             max_buffer=args.max_buffer, **endpoint_arguments(args),
                             **memory_arguments(args))
    try:
        print(f"gdrprobe serve: listening on {args.bind}:{server.port}", flush=True)
        print(f"gdrprobe serve: token {token}", flush=True)
        server.serve(runs=1 if args.once else None)
    finally:
        server.close()
    return 0
