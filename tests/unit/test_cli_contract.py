"""One text contract on every path, errors included (issue 41 item 4), each case as the
walkthrough met it, run as an operator runs the command: a process, its output and exit
code. Network cases talk to loopback servers of this test only."""

from __future__ import annotations

import http.server
import shutil
import os
import socket
import socketserver
import subprocess
import sys
import threading

import pytest

from gdrprobe.errors import SCHEDULER_ACTION, ExitCode
from tests.unit.machine import no_cuda_driver_only, no_rdma_device_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def with_root(environ) -> dict:
    """environ with this checkout first on PYTHONPATH (and what was there kept: a suite run
    without a dependency puts its blocker there)."""
    path = os.pathsep.join(filter(None, [ROOT, environ.get("PYTHONPATH")]))
    return {**environ, "PYTHONPATH": path}


def gdrprobe(*argv: str, stdin: str | None = None, timeout: float = 120,
             **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gdrprobe", *argv], capture_output=True,
                          text=True, timeout=timeout, input=stdin, env=with_root({**os.environ, **env}))


# ---- a port that is not gdrprobe's is recognised in the first exchange --------------------


class LineServer(socketserver.StreamRequestHandler):
    """A line-based protocol (memcached's text protocol, Redis's inline commands): it reads
    a line, answers a short error, and waits for the next line."""

    def handle(self):
        while self.rfile.readline():
            self.wfile.write(b"ERROR\r\n")


class BannerServer(socketserver.BaseRequestHandler):
    """A protocol whose server speaks first, shorter than gdrprobe's header, then waits."""

    def handle(self):
        self.request.sendall(b"+OK\r\n")
        self.request.recv(65536)
        self.request.recv(65536)


class QuietHttp(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(params=["http", "line", "banner"])
def stranger(request):
    """A loopback TCP server that speaks something else; yields its port."""
    handler = {"http": QuietHttp, "line": LineServer, "banner": BannerServer}[request.param]
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_port_that_is_not_gdrprobe_is_recognised_in_the_first_exchange(stranger):
    """Not a wait for the time-out (a 30 s "did not answer"): the first bytes it sends, or
    its answer to a hello that ends its line, are not gdrprobe's frame."""
    import gdrprobe as api

    done = gdrprobe("run", "127.0.0.1", "-p", str(stranger), "--token", api.new_token(),
                    "--timeout", "600", timeout=60)
    assert done.returncode == ExitCode.PEER, done.stderr
    assert "does not speak the gdrprobe protocol" in done.stderr
    assert "did not answer" not in done.stderr


def test_a_gdrprobe_hello_is_still_one_line_a_json_parser_takes():
    """The hello's JSON ends with CRLF, JSON's own whitespace: every gdrprobe reads it."""
    from gdrprobe.protocol.channel import HEADER, line_frame, parse_message

    frame = line_frame("hello", nonce="00" * 32)
    assert frame.endswith(b"\r\n")
    assert parse_message(frame[HEADER.size:], "client")["type"] == "hello"


def silent_port() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    return listener


def test_a_silent_port_still_times_out_with_its_own_words():
    """A server that accepts and says nothing cannot be told from a slow gdrprobe."""
    import gdrprobe as api

    with silent_port() as listener:
        done = gdrprobe("run", "127.0.0.1", "-p", str(listener.getsockname()[1]), "--token",
                        api.new_token(), "--timeout", "5", timeout=60)
    assert done.returncode == ExitCode.PEER
    assert "did not answer within 5 s" in done.stderr


# ---- nccl-log - reads standard input -------------------------------------------------------

NCCL_LOGS = os.path.join(ROOT, "tests", "unit", "fixtures", "nccl_logs")


def test_nccl_log_dash_reads_standard_input():
    with open(os.path.join(NCCL_LOGS, "gdr-off-every-nic-nccl-2.18.5.log")) as log:
        text = log.read()
    path = os.path.join(NCCL_LOGS, "gdr-off-every-nic-nccl-2.18.5.log")
    piped = gdrprobe("nccl-log", "-", "--json", stdin=text)
    named = gdrprobe("nccl-log", path, "--json")
    assert piped.returncode == named.returncode == 1, piped.stderr
    assert '"source": "-"' in piped.stdout
    assert piped.stdout.replace('"source": "-"', "") == named.stdout.replace(
        f'"source": "{path}"', "")


def test_nccl_log_dash_with_nothing_on_standard_input_says_so():
    done = gdrprobe("nccl-log", "-", stdin="")
    assert done.returncode == ExitCode.USAGE
    assert "NCCL log on standard input is empty" in done.stderr


# ---- usage errors before any probing -------------------------------------------------------


@pytest.mark.parametrize("argv, named", [
    (["bench", "-q", "0"], "QPs must be 1 to"),
    (["bench", "--qp", "0"], "QPs must be 1 to"),
    (["bench", "-q", "1,0"], "QPs must be 1 to"),
    (["bench", "--latency-iters", "0"], "--latency-iters 0"),
    (["bench", "--latency-iters", "-5"], "--latency-iters -5"),
    (["bench", "--timeout", "0"], "time-out must be"),
    (["bench", "-i", "0"], "--ib-port 0"),
    (["bench", "-x", "-1"], "--gid-index -1"),
    (["check", "-x", "-1"], "--gid-index -1"),
    (["check", "--node", "-x", "-1"], "--gid-index -1"),
    (["run", "--loopback", "-x", "-1"], "--gid-index -1"),
])
def test_a_usage_error_is_exit_2_before_any_device_is_looked_for(argv, named):
    """Not the device probe's exit 4 (drain) on a machine without RDMA, nor a run."""
    done = gdrprobe(*argv)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert named in done.stderr
    assert "RDMA device" not in done.stderr


def test_the_api_refuses_the_same_before_probing():
    import gdrprobe as api

    for call in (lambda: api.bench(qps=(0,)), lambda: api.bench(latency_iterations=0),
                 lambda: api.bench(timeout_s=0), lambda: api.check(gid_index=-1)):
        with pytest.raises(api.UsageError):
            call()


def test_no_latency_rows_is_its_own_flag():
    done = gdrprobe("bench", "--no-latency", "--latency-iters", "5")
    assert done.returncode == ExitCode.USAGE and "not allowed with" in done.stderr


# ---- check's exit line and --quiet's one line, on error paths too ------------------------


@pytest.fixture
def low_memlock(engine, monkeypatch):
    """A container without IPC_LOCK: 64 KiB of locked memory, under the 8 MiB the check
    needs at least; one GPU and its NIC (the engine's recorders)."""
    from gdrprobe.campaign import memlock
    from tests.unit.fakes.engine import one_gpu_machine

    one_gpu_machine(monkeypatch)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(memlock, "locked_memory",
                        lambda root=None: memlock.LockedMemory(64 << 10, 64 << 10))
    return engine


DRAIN_LINE = f" exit {int(ExitCode.RESOURCE_LIMIT)}: {SCHEDULER_ACTION[ExitCode.RESOURCE_LIMIT]}"


@pytest.mark.parametrize("node", [[], ["--node"]], ids=["gpu", "node"])
def test_an_error_ends_with_the_exit_line_as_every_answer_does(low_memlock, capsys, node):
    from gdrprobe.cli import main

    assert main(["check", *node]) == ExitCode.RESOURCE_LIMIT
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("gdrprobe: error: this run pins 8.0 MiB")
    assert err[-1] == DRAIN_LINE


@pytest.mark.parametrize("node", [[], ["--node"]], ids=["gpu", "node"])
def test_an_error_under_quiet_is_one_line_with_its_exit_and_fix(low_memlock, capsys, node):
    from gdrprobe.cli import main

    assert main(["check", "--quiet", *node]) == ExitCode.RESOURCE_LIMIT
    out = capsys.readouterr()
    [line] = out.err.splitlines()
    assert out.out == ""
    assert line.startswith("gdrprobe check: error (exit 8: drain): this run pins 8.0 MiB")
    assert "; fix: raise the limit to at least 8192 KiB" in line


def test_a_refused_command_line_of_check_says_its_exit_too(capsys):
    from gdrprobe.cli import main

    with pytest.raises(SystemExit):
        main(["check", "--no-such-flag"])
    err = capsys.readouterr().err.splitlines()
    assert err[-2] == "gdrprobe check: error: unrecognized arguments: --no-such-flag"
    assert err[-1] == " exit 2: warn"
    with pytest.raises(SystemExit):
        main(["check", "--quiet", "--no-such-flag"])
    assert capsys.readouterr().err.splitlines() == [
        "gdrprobe check: error (exit 2: warn): unrecognized arguments: --no-such-flag"]


def test_another_commands_error_keeps_its_own_text(capsys):
    from gdrprobe.cli import main

    assert main(["bench", "-q", "0"]) == ExitCode.USAGE
    assert "exit 2" not in capsys.readouterr().err


# ---- check --node --all-rails with no GPU -----------------------------------------------------


@no_rdma_device_only
@no_cuda_driver_only
def test_all_rails_with_no_gpu_says_no_gpu_and_no_rail_under_its_exit_9():
    """Was: "1 GPU(s)" and "rails: one rail (exit 0: start the job)" under an exit 9: a node
    with no GPU has no rail to run, which is its own not-testable answer."""
    environ = {name: "" for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS",
                                     "SLURM_STEP_GPUS", "NVIDIA_VISIBLE_DEVICES")}
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "check", "--node", "--all-rails"],
                          capture_output=True, text=True, timeout=120,
                          env=with_root({k: v for k, v in os.environ.items()
                                         if k not in environ}))
    assert done.returncode == ExitCode.NOT_TESTABLE, done.stderr
    assert "1 GPU(s)" not in done.stdout and "exit 0" not in done.stdout
    assert "rails: no rail (exit 9: warn): no rail engaged alone" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("node: no GPU in ")


# ---- every rank's error names its rank and host ----------------------------------------------


def launched_as(rank: str, size: str) -> dict:
    return {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size, "PMIX_RANK": rank}


def test_a_cluster_ranks_error_names_its_rank_and_host():
    done = gdrprobe("cluster", "--slow-fraction", "5", **launched_as("3", "16"))
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.startswith(
        f"gdrprobe: error on rank 3 of 16 ({socket.gethostname()}): --slow-fraction 5")


@pytest.mark.parametrize("variables, named", [
    ({"PMI_RANK": "5", "PMI_SIZE": "8"}, "rank 5 of 8"),          # MPICH's Hydra
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}, "rank 2 of 4"),  # srun
    ({}, "error on this rank"),                                   # no launcher said
])
def test_each_launchers_rank_is_read(variables, named):
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "cluster", "--slow-fraction", "5"],
                          capture_output=True, text=True, timeout=60,
                          env=with_root({**environ, **variables}))
    assert done.returncode == ExitCode.USAGE
    assert named in done.stderr.splitlines()[0]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun "
                    "(./dev setup installs openmpi-bin)")
def test_under_mpirun_each_rank_says_which_it_is():
    # mpirun kills the other ranks once one exits non-zero (Open MPI 4's
    # orte_abort_on_non_zero_status), which can come before the other's error line is out.
    done = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                           "--mca", "btl", "self,tcp", "--mca", "orte_abort_on_non_zero_status",
                           "0", sys.executable, "-m", "gdrprobe",
                           "cluster", "--slow-fraction", "5"], capture_output=True, text=True,
                          timeout=120, env=with_root(dict(os.environ)))
    errors = [line for line in done.stderr.splitlines() if line.startswith("gdrprobe: error")]
    assert sorted(line.split(" (")[0] for line in errors) == [
        "gdrprobe: error on rank 0 of 2", "gdrprobe: error on rank 1 of 2"]
