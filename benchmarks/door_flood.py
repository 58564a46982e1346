"""What a flood of token proofs costs the server and the strangers, and how long a client
that knows the token waits meanwhile (issue 30; SECURITY.md states the bound).

On loopback only: a server's door (the real one, with a real token: every proof it checks
costs a scrypt) on 127.0.0.1; stranger processes (tests/strangers.py ProofFlood) that, from
each of many loopback addresses (127.0.0.2 and up), solve whatever puzzle the door asks and
send a random proof, again as soon as they are refused; and a client that knows the token,
connecting every few seconds from 127.0.0.1 as `gdrprobe run` does (ProbeClient: its pauses
and tries). Bounded in time (--seconds per flood) and in proofs. CPU is each process's own
(getrusage: user + system), so the ratio is server CPU per stranger CPU; the strangers
solve in Python, as this client does, and a native solver does the same work in a third of
the time (`openssl speed`, below): the ratio for a native stranger is printed too.

    .venv/bin/python benchmarks/door_flood.py [--addresses 64 256] [--seconds 60]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOKEN_ENV = "GDRPROBE_BENCH_TOKEN"
MAX_PROOFS = 200_000          # per stranger process: a bound besides the time
WORKERS = 3                   # connections at once per stranger process (one core each)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- the roles, each in a process of its own -----------------------------------------------


def serve() -> None:
    """The door with a real token until stdin closes; then what it spent, as JSON."""
    from gdrprobe.protocol import handshake as hs
    from gdrprobe.protocol.admission import ProofQueue
    from gdrprobe.protocol.door import Door
    from gdrprobe.protocol.handshake import ServerSecret

    checked, asked, lock = [], [], threading.Lock()
    stretch = hs.stretch

    class Recording(ProofQueue):
        def get(self):
            pending = super().get()
            if pending is not None:
                with lock:
                    checked.append(pending.bits)
            return pending

    def counted_stretch(token, salt):
        started = time.thread_time()
        key = stretch(token, salt)
        with lock:
            asked.append(time.thread_time() - started)
        return key

    hs.stretch = counted_stretch
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    lines: list[str] = []
    door = Door(listener, ServerSecret(os.environ[TOKEN_ENV]), lambda channel, address: channel.close(),
                lines.append, proofs=Recording())
    thread = threading.Thread(target=door.run)
    thread.start()
    print(listener.getsockname()[1], flush=True)
    sys.stdin.read()
    door.close()
    thread.join(30)
    print(json.dumps({"cpu_s": cpu_s(), "checked": len(checked),
                      "checked_under_paid": sum(bits < hs.PAID_PUZZLE_BITS for bits in checked),
                      "scrypt_cpu_s": statistics.median(asked) if asked else 0.0,
                      "log": [line for line in lines if "bits of work of new" in line][:4]}))


def strangers(port: int, first: int, count: int, seconds: float) -> None:
    """Strangers from 127.0.0.first .. first+count-1 for `seconds`; what they spent, as JSON."""
    from tests.strangers import ProofFlood

    addresses = [f"127.0.{(host >> 8) & 255}.{host & 255}" for host in range(first, first + count)]
    with ProofFlood(port, addresses, max_proofs=MAX_PROOFS, max_s=seconds,
                    workers=WORKERS) as flood:
        time.sleep(seconds)
    print(json.dumps({"cpu_s": cpu_s(), "proofs": len(flood.bits), "refusals": dict(flood.refusals),
                      "bits": {str(bits): flood.bits.count(bits) for bits in sorted(set(flood.bits))}}))


def client(port: int, address: str) -> dict:
    """One run's admission, as `gdrprobe run` makes it: seconds to the welcome, the notices."""
    from gdrprobe.errors import PeerError
    from gdrprobe.measure.client import ProbeClient
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.rdma.endpoint import EndpointOptions

    notices: list[str] = []
    probe = ProbeClient(address, port, os.environ[TOKEN_ENV], ProbeOptions(), EndpointOptions(),
                        notice=notices.append)
    started = time.monotonic()
    try:
        probe.authenticated().close()
        ended = "welcome"
    except PeerError as error:
        ended = error.cause
    return {"seconds": time.monotonic() - started, "ended": ended, "notices": notices}


# ---- the benchmark --------------------------------------------------------------------------


def child(*args: str, stdin=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=stdin, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)


def flood(addresses: int, seconds: float, processes: int, every_s: float) -> dict:
    server = child("--role", "server", stdin=subprocess.PIPE)
    port = int(server.stdout.readline())
    share = -(-addresses // processes)
    crowd = [child("--role", "strangers", "--port", str(port), "--first", str(2 + i * share),
                   "--count", str(min(share, addresses - i * share)), "--seconds", str(seconds))
             for i in range(processes) if i * share < addresses]
    runs, ends = [], time.monotonic() + seconds
    time.sleep(min(5.0, seconds / 4))               # the flood first
    while time.monotonic() < ends:
        runs.append(client(port, "127.0.0.1"))
        time.sleep(every_s)
    crowd_out = [json.loads(process.communicate()[0]) for process in crowd]
    server_out = json.loads(server.communicate("")[0])
    return {"server": server_out, "strangers": crowd_out, "client": runs}


def native_hash_s() -> float | None:
    """One single-block SHA-256 in OpenSSL (`openssl speed`), the fastest CPU stranger."""
    try:
        out = subprocess.run(["openssl", "speed", "-seconds", "2", "-bytes", "16", "-evp", "sha256"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rate_kb = float(out.strip().splitlines()[-1].split()[-1].rstrip("k"))
    return 16 / (rate_kb * 1000)


def python_hash_s() -> float:
    prefix, tries = hashlib.sha256(secrets.token_bytes(89)), 1 << 17
    started = time.process_time()
    for counter in range(tries):
        attempt = prefix.copy()
        attempt.update(counter.to_bytes(8, "big"))
        attempt.digest()
    return (time.process_time() - started) / tries


def report(addresses: int, result: dict, python_s: float, native_s: float | None) -> None:
    server, crowd, runs = result["server"], result["strangers"], result["client"]
    stranger_cpu = sum(part["cpu_s"] for part in crowd)
    proofs = sum(part["proofs"] for part in crowd)
    bits: dict[str, int] = {}
    refusals: dict[str, int] = {}
    for part in crowd:
        for key, count in part["bits"].items():
            bits[key] = bits.get(key, 0) + count
        for key, count in part["refusals"].items():
            refusals[key] = refusals.get(key, 0) + count
    ratio = server["cpu_s"] / stranger_cpu if stranger_cpu else float("inf")
    admitted = [run for run in runs if run["ended"] == "welcome"]
    print(f"{addresses} addresses: server {server['cpu_s']:.1f} s of CPU, strangers {stranger_cpu:.1f} s "
          f"({len(crowd)} processes): server per stranger CPU {ratio:.2f}"
          + (f" (a native stranger: {server['cpu_s'] / (stranger_cpu * native_s / python_s):.2f})"
             if native_s else ""))
    print(f"  {proofs} proofs sent, {server['checked']} checked ({server['checked_under_paid']} worked "
          f"for less than the paid bits, on free checks); a scrypt {server['scrypt_cpu_s'] * 1e3:.0f} ms "
          f"of CPU; bits asked: {bits}; refusals: {refusals}")
    waits = [run["seconds"] for run in admitted]
    print(f"  client: {len(admitted)} of {len(runs)} admitted, wait median "
          f"{statistics.median(waits) if waits else 0:.2f} s, longest {max(waits, default=0):.2f} s; "
          f"tries beyond the first: {sum(len([n for n in run['notices'] if 'trying again' in n]) for run in runs)}")
    for run in runs:
        if run["ended"] != "welcome":
            print(f"  client refused: {run['ended']}")
    for line in server["log"][:2]:
        print(f"  server log: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addresses", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seconds", type=float, default=60.0, help="each flood lasts this long")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 2,
                        help="stranger processes (default: one per CPU)")
    parser.add_argument("--client-every", type=float, default=3.0, help="seconds between client runs")
    parser.add_argument("--role", choices=("server", "strangers"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "server":
        serve()
        return 0
    if args.role == "strangers":
        strangers(args.port, args.first, args.count, args.seconds)
        return 0
    os.environ[TOKEN_ENV] = secrets.token_urlsafe(18)
    python_s, native_s = python_hash_s(), native_hash_s()
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; SHA-256 a try: "
          f"{python_s * 1e6:.3f} us in Python, "
          + (f"{native_s * 1e6:.3f} us in OpenSSL" if native_s else "OpenSSL not found"))
    for addresses in args.addresses:
        report(addresses, flood(addresses, args.seconds, args.processes, args.client_every),
               python_s, native_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
