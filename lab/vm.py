"""Boot lab guests with virtme-ng and run one command in each.

A guest shares this machine's root file system (read-only, with writable overlays), so it
sees the same checkout and the same virtual environment. Every guest runs in its own
process group, which is killed on time-out or error: no QEMU is left behind.
"""

from __future__ import annotations

import compileall
import dataclasses
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

from lab.kernel import REPO, LabError, ensure_kernel

VENV_BIN = os.path.join(REPO, ".venv", "bin")
# lab/bin/virtiofsd lets virtme-ng share the root through virtiofs with a cache (see there).
LAB_BIN = os.path.join(REPO, "lab", "bin")
GUEST_INIT = os.path.join(REPO, "lab", "guest_init.sh")
WIRE_PREFIX = "10.77.0"
HOST_ADDRESSES = {"a": f"{WIRE_PREFIX}.1", "b": f"{WIRE_PREFIX}.2"}
B_GRACE_SECONDS = 60.0
# After a guest's group is killed, how long to read what it printed: a process that left
# the group (setsid) may hold the pipe open for as long as it lives.
KILLED_OUTPUT_S = 10.0


@dataclasses.dataclass
class GuestResult:
    name: str
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False


class Guest:
    """One QEMU guest running one command; a context manager that always reaps it."""

    def __init__(self, name: str, command: str, *, wire: str | None = None,
                 qemu_opts: str = "", cpus: int = 2, memory: str = "1G",
                 kernel_args: tuple[str, ...] = ()):
        self.name = name
        self.command = command
        self.wire = wire
        self.qemu_opts = qemu_opts
        self.cpus = cpus
        self.memory = memory
        self.kernel_args = kernel_args
        self.process: subprocess.Popen | None = None
        self.started = 0.0

    def argv(self, kernel: str) -> list[str]:
        init = [GUEST_INIT, "wire", f"{self.wire}/24"] if self.wire else [GUEST_INIT, "loopback"]
        inner = " ".join(shlex.quote(a) for a in ["bash", *init, "--"]) + " " + self.command
        argv = [os.path.join(VENV_BIN, "vng"), "-r", kernel, "--disable-kvm",
                "--name", self.name, "--cpus", str(self.cpus), "--memory", self.memory,
                "--cwd", REPO, "--exec", inner]
        for kernel_arg in self.kernel_args:
            argv += ["--append", kernel_arg]
        if self.qemu_opts:
            argv.append(f"--qemu-opts={self.qemu_opts}")
        return argv

    def start(self, kernel: str) -> Guest:
        compile_checkout()
        path = os.pathsep.join([LAB_BIN, VENV_BIN, os.environ.get("PATH", "")])
        env = dict(os.environ, PATH=path)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.argv(kernel), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env, cwd=REPO, start_new_session=True)
        return self

    def wait(self, timeout: float) -> GuestResult:
        assert self.process is not None
        try:
            output, _ = self.process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            self.kill()
            try:
                output, _ = self.process.communicate(timeout=KILLED_OUTPUT_S)
            except subprocess.TimeoutExpired as held:
                output = (held.output or b"") + b"\n(output cut: the pipe is still held open)\n"
            timed_out = True
        text = output.decode("utf-8", "replace")
        code = self.process.returncode if not timed_out else 124
        return GuestResult(self.name, code, text, time.monotonic() - self.started, timed_out)

    def kill(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=5)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_listener(port: int, guest: Guest, timeout: float = 60.0) -> None:
    """Wait until QEMU listens on port, without connecting: the socket backend would take
    a probing connection as its peer."""
    needle = f":{port:04X} 00000000:0000 0A"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/net/tcp") as table:
            if any(needle in line for line in table):
                return
        if guest.process and guest.process.poll() is not None:
            raise LabError(f"guest {guest.name} exited before its network came up:\n"
                           + guest.process.stdout.read().decode("utf-8", "replace"))
        time.sleep(0.2)
    raise LabError(f"guest {guest.name} did not listen on 127.0.0.1:{port} in {timeout:.0f} s")


def compile_checkout() -> None:
    """Bring the checkout's bytecode up to date here: a guest's root is read-only, so a
    module changed since this machine last imported it was compiled again by every
    Python process in every guest (64 modules, over a second per process in the lab)."""
    for folder in ("gdrprobe", "lab", "tests", "benchmarks"):
        compileall.compile_dir(os.path.join(REPO, folder), quiet=1)


def run_loopback(command: str, timeout: float = 600) -> GuestResult:
    """One guest with rxe0 on lo; runs command and returns its output and exit code."""
    kernel = ensure_kernel()
    with Guest("gdr-lo", command).start(kernel) as guest:
        return guest.wait(timeout)


def wire_opts(port: int, role: str, mac_suffix: int) -> str:
    backend = f"listen=127.0.0.1:{port}" if role == "listen" else f"connect=127.0.0.1:{port}"
    return (f"-netdev socket,id=w0,{backend} "
            f"-device virtio-net-pci,netdev=w0,mac=52:54:00:00:00:{mac_suffix:02x}")


def run_pair(command_a: str, command_b: str, timeout: float = 600) -> tuple[GuestResult, GuestResult]:
    """Two guests joined by a virtual wire: host b (10.77.0.2) listens, host a (10.77.0.1)
    connects. Both commands run; b's gets a grace period once a's has ended."""
    kernel = ensure_kernel()
    port = free_port()
    deadline = time.monotonic() + timeout
    guest_b = Guest("gdr-b", command_b, wire=HOST_ADDRESSES["b"], cpus=1,
                    qemu_opts=wire_opts(port, "listen", 2))
    guest_a = Guest("gdr-a", command_a, wire=HOST_ADDRESSES["a"], cpus=1,
                    qemu_opts=wire_opts(port, "connect", 1))
    with guest_b, guest_a:
        guest_b.start(kernel)
        wait_for_listener(port, guest_b)
        guest_a.start(kernel)
        result_a = guest_a.wait(max(1.0, deadline - time.monotonic()))
        result_b = guest_b.wait(B_GRACE_SECONDS)
    return result_a, result_b


def print_result(result: GuestResult, stream=sys.stdout) -> None:
    status = "timed out" if result.timed_out else f"exit {result.returncode}"
    print(f"==== guest {result.name}: {status} after {result.seconds:.1f} s", file=stream)
    print(result.output.rstrip(), file=stream)
