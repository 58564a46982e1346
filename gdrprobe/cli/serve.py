"""gdrprobe serve: lend a scratch buffer to authenticated clients, one run at a time."""

from __future__ import annotations

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.common import (add_endpoint_flags, add_memory_flags, endpoint_arguments,
                                 memory_arguments, terminate_as_interrupt, token_from)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="wait for 'gdrprobe run' clients",
        description="Serve probe runs, one after another, to clients that know the token.")
    add_endpoint_flags(parser)
    add_memory_flags(parser, remote=False)
    parser.add_argument("--bind", default=defaults.BIND,
                        help=f"address to listen on (default {defaults.BIND})")
    parser.add_argument("--once", action="store_true", help="exit after one run")
    parser.add_argument("--max-buffer", type=int, default=defaults.MAX_BUFFER, metavar="BYTES",
                        help="largest buffer a client may ask for (default "
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
