"""Every way a run can go wrong ends with a clear error, in bounded time, with nothing
left registered, and the server keeps serving."""

import signal
import socket
import struct

import pytest

from tests.lab.helpers import client, gdrprobe, gdrprobe_json, rdma_resources, wait_for_run
from tests.lab.loopback.conftest import TOKEN

LONG_RUN = ("127.0.0.1", "--token", TOKEN, "-s", "65536", "-D", "60", "--timeout", "5")


def wait_until_running() -> None:
    wait_for_run()   # past set-up, inside the timed loop


def assert_server_still_serves():
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "256", "-n", "10")
    assert report["bandwidth"][0]["integrity"]["bad_bytes"] == 0


def test_wrong_token_is_refused_before_any_key(server, baseline):
    done = gdrprobe("run", "127.0.0.1", "--token", "not-the-lab-token-0123456789", "-n", "10",
                    timeout=60)
    assert done.returncode == 5
    assert "the server refused the connection: the token did not match" in done.stderr
    assert_server_still_serves()
    assert rdma_resources() == baseline
    assert "token" in server.stop()


def test_missing_token_is_a_usage_error():
    done = gdrprobe("run", "127.0.0.1", timeout=60)
    assert done.returncode == 2 and "--token" in done.stderr


def test_server_not_running():
    done = gdrprobe("run", "127.0.0.1", "-p", "18799", "--token", TOKEN, timeout=60)
    assert done.returncode == 5
    assert "cannot reach a gdrprobe server" in done.stderr


@pytest.mark.parametrize("payload", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                       # not our protocol
    struct.pack(">4sHI", b"GDRP", 1, 1 << 30),                # an oversized message
    struct.pack(">4sHI", b"GDRP", 1, 5) + b"nojsn",           # not JSON
    b"",                                                        # silence: the time-out
])
def test_garbage_on_the_oob_port_leaves_the_server_serving(server, payload):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(payload)
        sock.settimeout(30)
        try:
            while sock.recv(4096):   # the server answers or hangs up, within its time-out
                pass
        except ConnectionResetError:
            pass
    assert_server_still_serves()


def test_client_killed_mid_run(server, baseline):
    victim = client(*LONG_RUN)
    wait_until_running()
    victim.kill()
    victim.wait(timeout=30)
    assert_server_still_serves()
    assert rdma_resources() == baseline
    # The kernel closes a killed process's socket with a FIN, or with a RST where data it
    # had received was still unread: the server says "closed" or "lost" (reset by peer).
    said = server.stop()
    assert "closed the connection" in said or (
        "lost the connection to the client" in said), said


def test_server_killed_mid_run(server, baseline):
    running = client(*LONG_RUN)
    wait_until_running()
    server.process.kill()
    server.process.wait(timeout=30)
    _, stderr = running.communicate(timeout=60)
    assert running.returncode == 5, stderr
    assert "peer" in stderr or "server" in stderr
    assert rdma_resources() == baseline


def test_ctrl_c_stops_the_client_and_releases_everything(server, baseline):
    running = client(*LONG_RUN)
    wait_until_running()
    running.send_signal(signal.SIGINT)
    # Half its -D 60 window is still ahead: a run the Ctrl-C did not stop would time out here.
    _, stderr = running.communicate(timeout=30)
    assert running.returncode == 130, stderr
    assert "interrupted" in stderr
    assert_server_still_serves()
    assert rdma_resources() == baseline


def test_ctrl_c_stops_a_loopback_run():
    running = client("--loopback", "-s", "65536", "-D", "60")
    wait_until_running()
    running.send_signal(signal.SIGINT)
    _, stderr = running.communicate(timeout=30)
    assert running.returncode == 130, stderr


def test_impossible_settings_are_refused():
    done = gdrprobe("run", "--loopback", "-t", "8", "-Q", "16", timeout=60)
    assert done.returncode == 2 and "CQ moderation" in done.stderr
    done = gdrprobe("run", "--loopback", "-d", "mlx5_7", timeout=60)
    assert done.returncode == 4 and "rxe0" in done.stderr


def test_ctrl_c_stops_the_server_mid_run_and_releases_everything(server, baseline):
    running = client(*LONG_RUN)
    wait_until_running()
    server.process.send_signal(signal.SIGINT)
    server_log, _ = server.process.communicate(timeout=30)
    assert server.process.returncode == 130, server_log
    _, stderr = running.communicate(timeout=60)
    assert running.returncode == 5, stderr
    assert rdma_resources() == baseline
