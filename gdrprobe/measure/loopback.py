"""Where a run happens: against a server on another host, or with both ends in this
process (loopback: a server thread and a client on 127.0.0.1 and the same device, the same
code path as two hosts). :func:`runner` chooses between them for the campaigns."""

from __future__ import annotations

import functools
import threading

from gdrprobe import defaults
from gdrprobe.errors import PeerError
from gdrprobe.measure.client import ProbeClient
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.server import ProbeServer
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.handshake import ServerSecret
from gdrprobe.rdma.endpoint import EndpointOptions
from gdrprobe.report.model import RunReport

LOOPBACK_HOST = "127.0.0.1"


@functools.cache
def loopback_secret() -> ServerSecret:
    """One random key for every loopback run of this process: both ends are this
    process, the client authenticates with this object (no token is stretched), and an A/B
    or a bench sweep runs many times."""
    return ServerSecret(None)


def run_loopback(options: ProbeOptions, endpoint_options: EndpointOptions,
                 memory: MemorySpec = MemorySpec(),
                 remote_memory: MemorySpec | None = None, on_result=None,
                 on_ready=None) -> RunReport:
    """A server thread and a client on 127.0.0.1 and the same device: one process, the
    same code path as two hosts."""
    secret = loopback_secret()
    # The server thread stays quiet: its errors reach the caller through the client. It
    # skips the preflight: the client opens the same device at once and fails with the
    # same cause; a run saves a device open and a registration.
    server = ProbeServer(secret, endpoint_options, bind=LOOPBACK_HOST, port=0,
                         timeout_s=options.timeout_s, log=lambda text: None, preflight=False)
    try:
        client = ProbeClient(LOOPBACK_HOST, server.port, secret, options, endpoint_options,
                             memory, remote_memory, on_result=on_result, on_ready=on_ready)
    except BaseException:
        server.close()
        raise
    outcome: dict = {}

    def serve():
        try:
            server.serve(runs=1)
        except Exception as error:   # the run's end, or a bug: told if the client failed
            outcome["error"] = error

    thread = threading.Thread(target=serve, name="gdrprobe-loopback-server", daemon=True)
    thread.start()
    try:
        return client.run()
    except PeerError as error:
        # The client saw the server hang up; the server thread knows why.
        thread.join(timeout=options.timeout_s)
        raise outcome.get("error", error) from error
    finally:
        server.close()
        thread.join(timeout=options.timeout_s)


def runner(options: ProbeOptions, endpoint_options: EndpointOptions, host: str | None = None,
           port: int = defaults.PORT, token: str | None = None, connect_wait_s: float = 0.0,
           on_result=None, notice=None, on_ready=None):
    """run_once(local_memory, remote_memory) -> RunReport: against host, or in loopback
    when host is None. The A/B calls it once per arm and repeat; a sweep passes on_result
    to see each size's result as it is measured; notice(text) hears what a person may want
    to know while it runs (a place in the server's queue); on_ready() is called once both
    ends are set up, just before the first loop (the rails' barrier)."""
    if host is None:
        return lambda local, remote: run_loopback(options, endpoint_options, local, remote,
                                                  on_result, on_ready)
    return lambda local, remote: ProbeClient(host, port, token, options, endpoint_options,
                                             local, remote, connect_wait_s, on_result,
                                             notice, on_ready).run()
