"""What a flood of token proofs costs the server and the strangers, and how long a client
that knows the token waits meanwhile (issues 30 and 43; SECURITY.md states the bound).

On loopback only: a server's door (the real one, with a real token: every proof it checks
costs a scrypt) on 127.0.0.1; strangers that, from each of many loopback addresses
(127.0.0.2 and up), solve whatever puzzle the door asks and send a random proof, again as
soon as they are refused; and a client that knows the token, connecting every few seconds
from 127.0.0.1 as `gdrprobe run` does (ProbeClient: its pauses and tries). Bounded in time
(--seconds per flood) and in proofs. CPU is each process's own (getrusage: user + system),
so the ratio is server CPU per stranger CPU.

The strangers solve in Python (tests/strangers.py ProofFlood, processes of a few threads,
as this client solves), or with --native N natively: N threads of one process, each with a
proof in flight, solving with a small C solver compiled here from NATIVE_SOLVER (OpenSSL's
SHA-256 from the state of the puzzle's first block, computed once: one compression a try,
the fastest a CPU stranger tries), pausing --native-pause seconds between proofs to stay a
trickle (issue 43: a third to a half of one core kept a client out). They run at the lowest
CPU priority (nice 19): on their own machines their solving would not take the CPU of the
server and the client, who share this one; their CPU is counted all the same.

    .venv/bin/python benchmarks/door_flood.py [--addresses 64 256] [--seconds 60]
    .venv/bin/python benchmarks/door_flood.py --addresses 256 --native 8 --native-pause 0.2
"""

from __future__ import annotations

import argparse
import ctypes
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
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOKEN_ENV = "GDRPROBE_BENCH_TOKEN"
SOLVER_ENV = "GDRPROBE_BENCH_SOLVER"    # the compiled native solver, for the stranger process
NATIVE_SOLVER = r"""
#include <openssl/sha.h>
#include <stdint.h>
#include <string.h>

/* The door's puzzle (gdrprobe/protocol/handshake.py): the first counter whose SHA-256 over
   the puzzle's input and the counter (8 bytes, big-endian) starts with `bits` zero bits.
   The state after the input's whole blocks is computed once; each try hashes the rest. */
uint64_t gdr_solve(const unsigned char *input, size_t length, int bits, unsigned char *solution,
                   uint64_t first) {
    SHA256_CTX midstate, attempt;
    unsigned char digest[SHA256_DIGEST_LENGTH], counter[8];
    SHA256_Init(&midstate);
    SHA256_Update(&midstate, input, length);
    for (uint64_t tries = first;; tries++) {
        for (int i = 0; i < 8; i++)
            counter[i] = (unsigned char)(tries >> (56 - 8 * i));
        attempt = midstate;
        SHA256_Update(&attempt, counter, sizeof counter);
        SHA256_Final(digest, &attempt);
        uint32_t head = (uint32_t)digest[0] << 24 | (uint32_t)digest[1] << 16 |
                        (uint32_t)digest[2] << 8 | digest[3];
        if (bits == 0 || head >> (32 - bits) == 0) {
            memcpy(solution, counter, sizeof counter);
            return tries - first + 1;
        }
    }
}
"""
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


def build_solver(directory: str) -> str | None:
    """NATIVE_SOLVER compiled into a shared library in directory (None: no compiler or no
    OpenSSL headers here)."""
    source, library = os.path.join(directory, "solver.c"), os.path.join(directory, "solver.so")
    with open(source, "w") as handle:
        handle.write(NATIVE_SOLVER)
    built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-Wno-deprecated-declarations", "-o",
                            library, source, "-lcrypto"], capture_output=True, text=True, timeout=120)
    return library if built.returncode == 0 else None


def load_solver(path: str):
    solver = ctypes.CDLL(path).gdr_solve       # ctypes lets go of the GIL while it runs
    solver.restype = ctypes.c_uint64
    solver.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_uint64)
    return solver


def native_try_s(path: str) -> float:
    """One try of the native solver, in seconds of CPU (2^16 of them, as a 16-bit puzzle
    that is never solved within them would take)."""
    solver, solution = load_solver(path), ctypes.create_string_buffer(8)
    data, tries, started = secrets.token_bytes(81), 0, time.process_time()
    while tries < 1 << 20:
        tries += solver(data, len(data), 20, solution, tries)
    return (time.process_time() - started) / tries


def native_strangers(port: int, first: int, count: int, seconds: float, workers: int,
                     pause_s: float, least_bits: int) -> None:
    """`workers` threads (tests/strangers.py ProofFlood), one proof each in flight, going
    round 127.0.x.y from `first` for `count` addresses, solving natively (to at least
    `least_bits`: a proof worked for more than it was asked is still counted at what it
    was asked) and pausing `pause_s` after each refusal; what they spent and met, as JSON."""
    from gdrprobe.protocol import handshake as hs
    from tests.strangers import ProofFlood

    os.nice(19)     # their own CPU, as on their own machines: never the server's or the client's
    solver = load_solver(os.environ[SOLVER_ENV])

    def solve(bits: int, client_nonce: bytes, server_nonce: bytes) -> bytes:
        data, solution = hs.puzzle_input(client_nonce, server_nonce), ctypes.create_string_buffer(8)
        solver(data, len(data), max(bits, least_bits), solution, 0)
        return solution.raw

    addresses = [f"127.0.{(host >> 8) & 255}.{host & 255}" for host in range(first, first + count)]
    samples: list[int] = []
    with ProofFlood(port, addresses, max_proofs=MAX_PROOFS, max_s=seconds, workers=workers,
                    solve=solve, pause_s=pause_s) as flood:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            time.sleep(0.1)
            samples.append(flood.in_flight)
    print(json.dumps({"cpu_s": cpu_s(), "proofs": len(flood.bits), "refusals": dict(flood.refusals),
                      "in_flight": [statistics.mean(samples) if samples else 0, max(samples, default=0)],
                      "bits": {str(b): flood.bits.count(b) for b in sorted(set(flood.bits))}}))


def client(port: int, address: str) -> dict:
    """One run's admission, as `gdrprobe run` makes it: seconds to the welcome, the notices."""
    from gdrprobe.errors import PeerError
    from gdrprobe.measure.client import ProbeClient
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.rdma.endpoint import EndpointOptions

    from gdrprobe.protocol import handshake as hs

    notices: list[str] = []
    solved: list[tuple[int, float]] = []      # (bits, seconds) of each puzzle this run solved
    solve = hs.solve_puzzle

    def timed_solve(bits, *nonces):
        began = time.monotonic()
        try:
            return solve(bits, *nonces)
        finally:
            solved.append((bits, round(time.monotonic() - began, 2)))

    hs.solve_puzzle = timed_solve
    probe = ProbeClient(address, port, os.environ[TOKEN_ENV], ProbeOptions(), EndpointOptions(),
                        notice=notices.append)
    started = time.monotonic()
    try:
        probe.authenticated().close()
        ended = "welcome"
    except PeerError as error:
        ended = error.cause
    finally:
        hs.solve_puzzle = solve
    return {"seconds": time.monotonic() - started, "ended": ended, "notices": notices,
            "solved": solved}


# ---- the benchmark --------------------------------------------------------------------------


def child(*args: str, stdin=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=stdin, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)


def flood(addresses: int, seconds: float, processes: int, every_s: float, native: int = 0,
          pause_s: float = 0.0, least_bits: int = 0) -> dict:
    server = child("--role", "server", stdin=subprocess.PIPE)
    port = int(server.stdout.readline())
    share = -(-addresses // processes)
    if native:
        crowd = [child("--role", "native", "--port", str(port), "--first", "2", "--count",
                       str(addresses), "--seconds", str(seconds), "--native", str(native),
                       "--native-pause", str(pause_s), "--native-bits", str(least_bits))]
    else:
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
    return {"server": server_out, "strangers": crowd_out, "client": runs, "seconds": seconds}


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


def report(addresses: int, result: dict, python_s: float, native_s: float | None,
           native: bool = False) -> None:
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
    who = (f"native, {crowd[0]['in_flight'][0]:.1f} proofs in flight on average, at most "
           f"{crowd[0]['in_flight'][1]}" if native else f"{len(crowd)} processes")
    print(f"{addresses} addresses: server {server['cpu_s']:.1f} s of CPU, strangers {stranger_cpu:.1f} s "
          f"({who}): server per stranger CPU {ratio:.2f}"
          + (f" (a native stranger: {server['cpu_s'] / (stranger_cpu * native_s / python_s):.2f})"
             if native_s and not native else ""))
    print(f"  {proofs} proofs sent, {server['checked']} checked ({server['checked_under_paid']} worked "
          f"for less than the paid bits, on free checks); a scrypt {server['scrypt_cpu_s'] * 1e3:.0f} ms "
          f"of CPU; bits asked: {bits}; refusals: {refusals}")
    waits = [run["seconds"] for run in admitted]
    print(f"  client: {len(admitted)} of {len(runs)} admitted, wait median "
          f"{statistics.median(waits) if waits else 0:.2f} s, longest {max(waits, default=0):.2f} s; "
          f"tries beyond the first: {sum(len([n for n in run['notices'] if 'trying again' in n]) for run in runs)}")
    beyond = [run["seconds"] - sum(seconds for _, seconds in run["solved"]) for run in admitted]
    print(f"  client's puzzles (bits, seconds): {[item for run in runs for item in run['solved']]}; "
          f"its wait beyond its own puzzles: median {statistics.median(beyond) if beyond else 0:.2f} s, "
          f"longest {max(beyond, default=0):.2f} s, while the strangers spent "
          f"{stranger_cpu / result['seconds']:.2f} s of CPU a second")
    for run in runs:
        if run["ended"] != "welcome":
            print(f"  client refused after {run['seconds']:.1f} s: {run['ended']}")
    for line in server["log"][:2]:
        print(f"  server log: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addresses", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seconds", type=float, default=60.0, help="each flood lasts this long")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 2,
                        help="stranger processes (default: one per CPU)")
    parser.add_argument("--client-every", type=float, default=3.0, help="seconds between client runs")
    parser.add_argument("--native", type=int, default=0, metavar="N",
                        help="N native strangers, one proof in flight each (default: Python ones)")
    parser.add_argument("--native-pause", type=float, default=0.0, metavar="SECONDS",
                        help="each native stranger's pause between proofs")
    parser.add_argument("--native-bits", type=int, default=0, metavar="BITS",
                        help="the native strangers solve at least this many bits, whatever they "
                             "are asked (20: only paid proofs, the free checks left unused)")
    parser.add_argument("--role", choices=("server", "strangers", "native"), help=argparse.SUPPRESS)
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
    if args.role == "native":
        native_strangers(args.port, args.first, args.count, args.seconds, args.native, args.native_pause,
                         args.native_bits)
        return 0
    os.environ[TOKEN_ENV] = secrets.token_urlsafe(18)
    with tempfile.TemporaryDirectory() as scratch:
        solver = build_solver(scratch)
        if solver is None and args.native:
            print("no C compiler or OpenSSL headers here: the native strangers cannot be built")
            return 1
        os.environ[SOLVER_ENV] = solver or ""
        python_s, openssl_s = python_hash_s(), native_hash_s()
        native_s = native_try_s(solver) if solver else openssl_s
        print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; SHA-256 a try: "
              f"{python_s * 1e6:.3f} us in Python, "
              + (f"{openssl_s * 1e6:.3f} us in OpenSSL (speed), " if openssl_s else "")
              + (f"{native_s * 1e6:.3f} us the native midstate solver" if solver else ""))
        for addresses in args.addresses:
            report(addresses, flood(addresses, args.seconds, args.processes, args.client_every,
                                    args.native, args.native_pause, args.native_bits),
                   python_s, native_s, bool(args.native))
    return 0


if __name__ == "__main__":
    sys.exit(main())
