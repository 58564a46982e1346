"""The arguments a person gives, refused with their fix before the machine is read or
anything is probed (both doors: the public API calls these first)."""

from __future__ import annotations

import os

from gdrprobe import defaults
from gdrprobe.errors import UsageError
from gdrprobe.numbers import is_decimal
from gdrprobe.sysroot import SysRoot


def percent_habit(flag: str, value: float) -> None:
    """A fraction given as a percent (90 for 0.9), refused with the fraction it meant: a
    --threshold 90 taken as given would drain every node."""
    if 1 < value <= 100:
        raise UsageError(f"{flag} {value:g} is over 1: it is a fraction, not a percent",
                         f"give a fraction of at most 1: {flag} {value / 100:g} if you "
                         f"meant {value:g}%")


def check_verdict(threshold: float, repeats: int) -> None:
    """The A/B's threshold and repeats, refused as the A/B (campaign.ab.ab_test) refuses
    them, but before the machine is read or anything is measured."""
    from gdrprobe.campaign.verdict import check_repeats

    check_threshold_given(threshold)
    check_repeats(repeats)


def check_threshold_given(threshold: float) -> None:
    from gdrprobe.campaign.verdict import check_threshold

    percent_habit("--threshold", threshold)
    check_threshold(threshold)


def check_floor(floor: float) -> None:
    """The fraction of the port's line rate the GPU arm must reach (0: no floor)."""
    if not 0 <= floor <= 1:
        raise UsageError(f"--floor {floor:g}: use a fraction of line rate from 0 to 1",
                         f"e.g. {defaults.FLOOR:g}; 0 turns the floor off")


def check_token(token: str | None, required: bool) -> None:
    """A token a server takes: required against a server, never one under the floor."""
    from gdrprobe.protocol.token import TOKEN_FIX, token_problem

    if required and not token:
        raise UsageError("no token: the server only talks to clients that know its token",
                         "pass --token TOKEN (printed by 'gdrprobe serve') or set "
                         f"{defaults.TOKEN_ENV}")
    problem = None if token is None else token_problem(token)
    if problem:
        raise UsageError(problem, TOKEN_FIX)


def check_nccl(nccl: str | None, root: str) -> None:
    """--nccl names something that is there (under root, for a capture): a typo would
    otherwise be searched past in silence, and the doctor would judge another libnccl."""
    if nccl is not None and not SysRoot(root).exists(os.path.abspath(nccl)):
        under = "" if os.path.abspath(root) == "/" else f" under the root {root}"
        raise UsageError(f"--nccl {nccl}: no such file or directory{under}",
                         "name the job's libnccl.so.2, its Python interpreter or its virtual "
                         "environment (e.g. --nccl /opt/venv); a capture keeps the --nccl it "
                         "was taken with: leave it out to replay that")


def check_gpus(*gpus: str | None) -> None:
    """Each GPU given as a GPU runtime names one (an ordinal or a PCI bus id), and the
    runtime GDRPROBE_GPU_RUNTIME names, if set, is one gdrprobe has, before the probe."""
    from gdrprobe.memory.runtime import check_gpu_selector, named_runtime

    named_runtime()
    for gpu in gpus:
        if gpu is not None:
            check_gpu_selector(str(gpu))


def check_host(host: str | None) -> None:
    """HOST:PORT in one (an ssh or URL habit) is refused with the port flag it meant: the
    port is its own argument, and the name would not resolve."""
    name, colon, port = (host or "").rpartition(":")
    if colon and is_decimal(port) and name and ":" not in name:
        raise UsageError(f"{host!r} is a host and a port in one",
                         f"give the port on its own: '{name} -p {port}' (the API: "
                         f"host={name!r}, port={port})")


def check_latency_a_b(opcode: str, local, remote) -> None:
    """Latency with GPU memory (the latency A/B): a loop whose CPU polls completions, not a
    receive buffer (defaults.LATENCY_A_B_OPCODES), and no GPU buffer where the CPU checks
    the bytes (measure.options.check_latency_memory: a READ's own end)."""
    from gdrprobe.measure.options import ProbeOptions, check_latency_memory

    if opcode not in defaults.LATENCY_A_B_OPCODES:
        raise UsageError("latency with GPU memory needs RDMA WRITE with immediate or READ: "
                         "the plain WRITE ping-pong has the CPU poll the receive buffer, "
                         "which it cannot do in GPU memory",
                         "add --opcode write_imm (perftest's --write_with_imm), or --opcode "
                         "read with --remote-mem, or drop --mem/--remote-mem")
    check_latency_memory(ProbeOptions(mode="latency", opcode=opcode), local, remote)


def check_endpoint(ib_port: int, gid_index: int | None) -> None:
    """The port and GID index as verbs numbers them: ports from 1 (ibv_query_port), a GID
    table's entries from 0 (ibv_query_gid); a negative index would reach the driver as a
    huge unsigned one."""
    if not 1 <= ib_port <= 255:
        raise UsageError(f"--ib-port {ib_port} is not a port number", "use 1 or 2")
    if gid_index is not None and gid_index < 0:
        raise UsageError(f"--gid-index {gid_index} is not a GID index: a port's GID table "
                         "counts from 0",
                         "give an index 'gdrprobe devices' lists, or leave -x out to take "
                         "the GID as NCCL does")


def latency_rows(latency_iterations: int | None) -> int:
    """A sweep's latency round trips per size: None leaves the latency rows out (0 in the
    report's settings); a number must be a count of round trips, at least one."""
    if latency_iterations is None:
        return 0
    if latency_iterations < 1:
        raise UsageError(f"--latency-iters {latency_iterations}: a latency row needs at "
                         "least one round trip",
                         "give 1 or more, or leave the latency rows out: --no-latency "
                         "(latency_iterations=None)")
    return latency_iterations


def check_pattern_name(pattern) -> None:
    """--pattern: one of defaults.PATTERNS, or none."""
    if pattern and pattern not in defaults.PATTERNS:
        raise UsageError(f"--pattern {pattern!r}: the patterns are {', '.join(defaults.PATTERNS)}",
                         "e.g. --pattern nccl: NCCL's own traffic over its IB transport")
