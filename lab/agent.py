"""A remote hand for two-host lab tests: runs on host b and obeys host a's tests.

Lab only. It listens on the virtual wire between two throw-away guests and runs the
commands it is sent, so a test on host a can start, kill and inspect a gdrprobe server
on host b. Requests and replies are JSON lines:

  {"op": "spawn", "name": N, "argv": [...]}   start a process (output kept)
  {"op": "wait", "name": N, "timeout": S}     its exit code and output (null code: running)
  {"op": "signal", "name": N, "signal": 9}    send it a signal
  {"op": "run", "argv": [...], "timeout": S}  run to completion: exit code, stdout, stderr
  {"op": "shutdown"}                          kill what is left and exit
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import tempfile

PORT = 7700
IDLE_EXIT_SECONDS = 900


class Agent:
    def __init__(self):
        self.processes: dict[str, tuple[subprocess.Popen, str]] = {}

    def spawn(self, name: str, argv: list[str]) -> dict:
        log = tempfile.NamedTemporaryFile(prefix=f"agent-{name}-", delete=False)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes[name] = (process, log.name)
        return {"pid": process.pid}

    def wait(self, name: str, timeout: float) -> dict:
        process, log = self.processes[name]
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        with open(log, "rb") as handle:
            output = handle.read().decode("utf-8", "replace")
        return {"returncode": code, "output": output}

    def signal(self, name: str, signum: int) -> dict:
        process, _ = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, signum)
        return {}

    def run(self, argv: list[str], timeout: float) -> dict:
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"returncode": None, "output": "timed out"}
        return {"returncode": done.returncode, "output": done.stdout.decode("utf-8", "replace"),
                "stderr": done.stderr.decode("utf-8", "replace")}

    def shutdown(self) -> None:
        for process, _ in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def handle(self, request: dict) -> dict:
        op = request["op"]
        if op == "spawn":
            return self.spawn(request["name"], request["argv"])
        if op == "wait":
            return self.wait(request["name"], float(request.get("timeout", 0)))
        if op == "signal":
            return self.signal(request["name"], int(request["signal"]))
        if op == "run":
            return self.run(request["argv"], float(request.get("timeout", 60)))
        raise ValueError(f"unknown op {op!r}")


def serve(address: str, port: int) -> None:
    agent = Agent()
    listener = socket.create_server((address, port))
    listener.settimeout(IDLE_EXIT_SECONDS)
    print(f"lab agent listening on {address}:{port}", flush=True)
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                return
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    request = json.loads(line)
                    if request["op"] == "shutdown":
                        stream.write(b"{}\n")
                        stream.flush()
                        return
                    try:
                        reply = {"ok": True, **agent.handle(request)}
                    except Exception as error:  # the test on host a reads the reason
                        reply = {"ok": False, "error": repr(error)}
                    stream.write(json.dumps(reply).encode() + b"\n")
                    stream.flush()
    finally:
        agent.shutdown()
        listener.close()


class AgentClient:
    """Used by the tests on host a."""

    def __init__(self, address: str, port: int = PORT, timeout: float = 120):
        self.sock = socket.create_connection((address, port), timeout=timeout)
        self.stream = self.sock.makefile("rwb")

    def call(self, op: str, **fields) -> dict:
        self.stream.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        self.stream.flush()
        reply = json.loads(self.stream.readline())
        if op != "shutdown" and not reply.get("ok"):
            raise RuntimeError(f"agent {op} failed: {reply.get('error')}")
        return reply

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="lab agent (host b of the two-host lab)")
    parser.add_argument("--address", default="10.77.0.2")
    parser.add_argument("--port", type=int, default=PORT)
    options = parser.parse_args()
    serve(options.address, options.port)
