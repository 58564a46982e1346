"""gdrprobe serve: lend a scratch buffer to authenticated clients, one run at a time."""

from __future__ import annotations

from gdrprobe.cli.common import (add_endpoint_flags, add_memory_flags, endpoint_options,
                                     memory_spec, terminate_as_interrupt, token_from)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="wait for 'gdrprobe run' clients",
        description="Serve probe runs, one after another, to clients that know the token.")
    add_endpoint_flags(parser)
    add_memory_flags(parser, remote=False)
    parser.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--once", action="store_true", help="exit after one run")
    parser.add_argument("--max-buffer", type=int, default=256 << 20, metavar="BYTES",
                        help="largest buffer a client may ask for (default 256 MiB)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from gdrprobe.doctor.runner import run_doctor
    from gdrprobe.protocol.channel import new_token
    from gdrprobe.measure.session import DEFAULT_PORT, ProbeServer

    terminate_as_interrupt()
    token = token_from(args, required=False) or new_token()
    server = ProbeServer(token, endpoint_options(args), bind=args.bind,
                         port=DEFAULT_PORT if args.port is None else args.port,
                         timeout_s=args.timeout,
                         max_buffer=args.max_buffer, memory=memory_spec(args, args.mem),
                         # sent to clients whose GPU arm uses this host's GPU buffer
                         findings=run_doctor().findings)
    print(f"gdrprobe serve: listening on {args.bind}:{server.port}", flush=True)
    print(f"gdrprobe serve: token {token}", flush=True)
    server.serve(runs=1 if args.once else None)
    return 0
