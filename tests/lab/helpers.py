"""Shared by the lab suites, which run inside Soft-RoCE guests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.cuda_standin.build import environment, standin_settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Open MPI's own transports over TCP on loopback: its RDMA transports would try rxe too.
MPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_pml": "ob1",
           "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}


def gdrprobe(*args: str, timeout: float = 300, check: bool = False,
             env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the CLI as a user would, in a process of its own (env: os.environ)."""
    done = subprocess.run([sys.executable, "-m", "gdrprobe", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"gdrprobe {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def over_standin(**settings: str) -> dict:
    """os.environ for a process that loads the stand-in libcuda.so.1 (tests/cuda_standin)
    and this checkout, the stand-in configured by `settings` (build.standin_settings)."""
    return {**environment(), "PYTHONPATH": REPO, **standin_settings(**settings)}


def gdrprobe_json(*args: str, timeout: float = 300) -> dict:
    return json.loads(gdrprobe(*args, "--json", timeout=timeout, check=True).stdout)


def rdma_resources() -> dict[str, int]:
    """How many QPs, CQs, PDs and MRs exist on the guest, from 'rdma resource show'."""
    out = subprocess.run(["rdma", "resource", "show"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    counts = {}
    for token in ("qp", "cq", "pd", "mr"):
        for line in out.splitlines():
            fields = line.split()
            if token in fields:
                counts[token] = int(fields[fields.index(token) + 1])
    return counts


def wait_for_run(qps: int = 3, timeout: float = 120) -> None:
    """Wait until this guest holds `qps` QPs (the kernel's own one included: 3 = both ends
    of a one-QP run), then a moment more: the run is then inside its loop, however slowly
    the guest started the processes."""
    deadline = time.monotonic() + timeout
    while rdma_resources().get("qp", 0) < qps:
        assert time.monotonic() < deadline, "the run did not reach its loop"
        time.sleep(0.2)
    time.sleep(1)


class Server:
    """A 'gdrprobe serve' process on this guest, for tests that need a separate server. Its
    log goes with its output, or to a pipe of its own (stderr=subprocess.PIPE) for a test
    that reads it late or not at all."""

    def __init__(self, token: str, bind: str = "127.0.0.1", port: int = 18750,
                 timeout: float = 5.0, extra: tuple[str, ...] = (),
                 stderr: int = subprocess.STDOUT):
        self.token, self.bind, self.port = token, bind, port
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gdrprobe", "serve", "--bind", bind, "-p", str(port),
             "--token", token, "--timeout", str(timeout), *extra],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO)
        first_line = self.process.stdout.readline()
        if "listening" not in first_line:
            self.process.kill()
            raise AssertionError(f"server did not start: {first_line}{self.process.stdout.read()}")

    def stop(self) -> str:
        """Stop it as Ctrl-C would and return what it logged."""
        if self.process.poll() is None:
            self.process.send_signal(2)
        output, _ = self.process.communicate(timeout=30)
        return output


def client(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gdrprobe", "run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
