"""Every pair of nodes of a job, measured across the wire: the ranks of an MPI job (one per
node) meet in rounds; in each round every pair runs one probe from its client rank to a
server its other rank starts, and rank 0 gathers the node x node matrix.

MPI is only the meeting place: mpi4py carries each round's plan and the server's address,
port and one-run token from the server rank to the client rank, and the rows back to rank 0.
The probe itself is the ordinary client and server (authenticated channel, verbs QPs).
"""

from __future__ import annotations

import dataclasses
import socket
import statistics
import threading
from typing import Callable

from gdrprobe import defaults
from gdrprobe.errors import ExitCode, GdrprobeError, MissingDependency, PeerError, UsageError, worst_exit_code
from gdrprobe.campaign import machine
from gdrprobe.campaign.ab import ab_test
from gdrprobe.campaign.arguments import percent_habit
from gdrprobe.campaign.plan import probe_options
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.loopback import runner
from gdrprobe.measure.server import ProbeServer
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.token import new_token
from gdrprobe.rdma import verbs
from gdrprobe.rdma.devices import list_devices
from gdrprobe.rdma.endpoint import EndpointOptions
from gdrprobe.report.model import BidirResult, ClusterPair, ClusterReport, RunReport

PATTERNS = ("all", "ring")
MPI4PY_FIX = ("install mpi4py for the system's MPI (Debian/Ubuntu: apt-get install "
              "python3-mpi4py openmpi-bin; or pip install mpi4py against your MPI) and launch "
              "with mpirun or srun, one rank per node")
ROUND_TAG = 41


@dataclasses.dataclass(frozen=True)
class ClusterPlan:
    """What cluster() is asked: this rank's memory and endpoint, which pairs, the runs'
    size, iterations and time-out, the A/B's repeats and threshold, what counts as slow
    (a pair under this fraction of the median), and the address the other ranks reach this
    one at (None: found)."""

    local: MemorySpec
    endpoint: EndpointOptions
    pattern: str = "all"
    size: int = defaults.A_B_SIZE
    iterations: int = defaults.ITERATIONS
    timeout_s: float = defaults.TIMEOUT_S
    bidir: bool = False
    repeats: int = defaults.REPEATS
    threshold: float = defaults.THRESHOLD
    slow_fraction: float = defaults.SLOW_FRACTION
    oob_address: str | None = None

    def __post_init__(self):
        percent_habit("--slow-fraction", self.slow_fraction)
        if not 0 < self.slow_fraction <= 1:
            raise UsageError(f"--slow-fraction {self.slow_fraction}: use a fraction over 0 "
                             f"and at most 1", f"e.g. {defaults.SLOW_FRACTION}")


def cluster(plan: ClusterPlan) -> ClusterReport | None:
    """This rank's part of the matrix: its node's facts where its memory is a GPU's (the
    A/B then registers it as NCCL does), its server for the pairs it serves, its probe for
    the pairs it measures."""
    facts = machine.run_facts(plan.local, loopback=False)
    view = (facts.nccl_environ, facts.nccl_rules) if facts else machine.nccl_view()
    options = probe_options({"iterations": plan.iterations, "timeout_s": plan.timeout_s,
                             "bidir": plan.bidir}, defaults.A_B_SIZE, plan.size, view)
    return run_cluster(
        world(), plan.pattern, pair_server(plan.endpoint, plan.timeout_s),
        lambda: advertised_address(plan.endpoint, plan.oob_address),
        pair_probe(options, plan.endpoint, machine.follow_nccl(plan.local, facts),
                   plan.repeats, plan.threshold, facts.findings if facts else ()),
        plan.slow_fraction)


def world():
    """mpi4py's COMM_WORLD, or the error that says how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise MissingDependency(f"mpi4py is not installed ({error})", MPI4PY_FIX) from error
    return MPI.COMM_WORLD


# ---- which pairs, in which round (pure) ---------------------------------------------


def pairs_of(size: int, pattern: str) -> list[tuple[int, int]]:
    """(client rank, server rank) of every pair the pattern measures."""
    if pattern not in PATTERNS:
        raise UsageError(f"--pattern {pattern!r} is not one of {', '.join(PATTERNS)}",
                         "use --pattern all (every pair) or --pattern ring")
    if size < 2:
        raise UsageError(f"a cluster check needs at least 2 ranks, not {size}",
                         "launch one rank per node: mpirun -np N (or srun -N N)")
    if pattern == "ring":
        return [(rank, (rank + 1) % size) for rank in range(size)] if size > 2 else [(0, 1)]
    return [(a, b) for a in range(size) for b in range(a + 1, size)]


def rounds_of(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The pairs in rounds where no rank is in two pairs: each NIC serves one probe at a
    time, so a round's numbers are not shared bandwidth. Greedy, in the given order."""
    rounds: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for pair in pairs:
        for index, ranks in enumerate(busy):
            if not ranks & set(pair):
                rounds[index].append(pair)
                ranks.update(pair)
                break
        else:
            rounds.append([pair])
            busy.append(set(pair))
    return rounds


# ---- one pair ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Meeting:
    """What the server rank tells its client rank: where to connect, with which token."""

    host: str
    port: int
    token: str
    node: str
    error: str = ""       # why the server rank could not start a server
    fix: str = ""         # that error's fix
    exit_code: int = 0    # and its exit code


def serve_pair(start_server: Callable[[str], object], address: str, comm, client: int) -> None:
    """Server rank of a pair: start a server with a fresh token, tell the client rank where
    it is, and stop it once the client says it is done."""
    token = new_token()
    try:
        server = start_server(token)
    except GdrprobeError as error:
        comm.send(Meeting(address, 0, "", socket.gethostname(), error=error.cause,
                          fix=error.fix, exit_code=int(error.exit_code)),
                  dest=client, tag=ROUND_TAG)
        comm.recv(source=client, tag=ROUND_TAG)
        return
    thread = threading.Thread(target=_serve_quietly, args=(server,), daemon=True,
                              name="gdrprobe-cluster-server")
    thread.start()
    try:
        comm.send(Meeting(address, server.port, token, socket.gethostname()), dest=client,
                  tag=ROUND_TAG)
        comm.recv(source=client, tag=ROUND_TAG)   # the client's "done"
    finally:
        server.close()
        thread.join()


def _serve_quietly(server) -> None:
    try:
        server.serve()
    except GdrprobeError:
        pass   # the client reports the run's failure; the server's view adds nothing


def measure_pair(measure: Callable[[Meeting], object], comm, server: int,
                 client: int) -> ClusterPair:
    """Client rank of a pair: meet the server rank, measure, tell it we are done."""
    meeting = comm.recv(source=server, tag=ROUND_TAG)
    try:
        outcome = None if meeting.error else measure(meeting)
    except GdrprobeError as error:
        outcome = error
    finally:
        comm.send("done", dest=server, tag=ROUND_TAG)
    if meeting.error:
        return ClusterPair(client, server, socket.gethostname(), meeting.node,
                           error=f"the server rank could not serve: {meeting.error}",
                           fix=meeting.fix, exit_code=meeting.exit_code)
    return pair_row(client, server, socket.gethostname(), meeting.node, outcome)


def pair_row(client: int, server: int, client_node: str, server_node: str,
             outcome) -> ClusterPair:
    """A RunReport (host arm only), a CheckReport (the A/B) or the error that ended it."""
    common = dict(client_rank=client, server_rank=server, client_node=client_node,
                  server_node=server_node)
    if isinstance(outcome, GdrprobeError):
        return ClusterPair(**common, error=outcome.cause, fix=outcome.fix,
                           exit_code=int(outcome.exit_code))
    if isinstance(outcome, RunReport):
        return ClusterPair(**common, host_gbps=outcome.bandwidth[-1].bandwidth_avg_gbps,
                           bidirectional=both_ways({"host": outcome.bidirectional[-1:]}))
    host, gpu = outcome.host_arm(), outcome.deciding_arm()
    verdict = outcome.verdict
    return ClusterPair(
        **common, bidirectional=both_ways({"host": host.bidirectional if host else (),
                                           "gpu": gpu.bidirectional if gpu else ()}),
        host_gbps=host.median_gbps if host else None,
        gpu_gbps=gpu.median_gbps if gpu else None,
        ratio=verdict.ratio, verdict=verdict.classification,
        likely_causes=verdict.likely_causes, fix=verdict.fix, exit_code=verdict.exit_code)


def both_ways(arms: dict[str, tuple[BidirResult, ...]]) -> dict[str, BidirResult]:
    """Per arm that ran both ways (--bidir), the medians of its repeats: each direction and
    the sum."""
    return {arm: BidirResult(rows[-1].size_bytes,
                             statistics.median(r.client_to_server_gbps for r in rows),
                             statistics.median(r.server_to_client_gbps for r in rows),
                             statistics.median(r.sum_gbps for r in rows))
            for arm, rows in arms.items() if rows}


def pair_probe(options: ProbeOptions, endpoint: EndpointOptions, local: MemorySpec,
               repeats: int, threshold: float, findings=()) -> Callable[[Meeting], object]:
    """measure(meeting) for a client rank: a host run, or the A/B when local is GPU memory
    (findings: this node's doctor findings, the evidence for its GPU)."""
    def measure(meeting: Meeting):
        probe = runner(options, endpoint, meeting.host, meeting.port, meeting.token,
                       connect_wait_s=options.timeout_s)
        if local.kind == "host":
            return probe(local, None)
        return ab_test(probe, local, None, repeats=repeats, threshold=threshold,
                       doctor_findings=findings)
    return measure


def pair_server(endpoint: EndpointOptions, timeout_s: float) -> Callable[[str], ProbeServer]:
    """start_server(token) for a server rank: a quiet server on an ephemeral port."""
    return lambda token: ProbeServer(token, endpoint, port=0, timeout_s=timeout_s,
                                     log=lambda text: None)


def advertised_address(endpoint: EndpointOptions, explicit: str | None = None) -> str:
    """The address the other ranks reach this one's server at: given, else the IPv4
    address of a RoCE v2 GID on the probed port, else what the host name resolves to."""
    if explicit:
        return explicit
    report = list_devices(endpoint.device)
    port = report.devices[0].port_info(endpoint.port) if report.devices else None
    if port is not None:
        found = verbs.ipv4_roce_v2_gid((gid.index, gid.gid, gid.type) for gid in port.gids)
        if found is not None:
            return verbs.gid_ip_address(found[1])
    return socket.gethostbyname(socket.gethostname())


# ---- the whole job ----------------------------------------------------------------------


def ready_everywhere(comm, find_address: Callable[[], str]) -> str:
    """This rank's address, once every rank found its own: a rank that cannot take part
    (no device, no GPU driver) stops the job on every rank with its reason, instead of
    leaving the others waiting for it."""
    try:
        address, failure = find_address(), None
    except GdrprobeError as error:
        address, failure = None, error
    reasons = comm.allgather(None if failure is None else failure.cause)
    if failure is not None:
        raise failure
    broken = [f"rank {rank}: {reason}" for rank, reason in enumerate(reasons) if reason]
    if broken:
        raise PeerError("other ranks cannot take part: " + "; ".join(broken),
                        "fix those nodes (their own output says how) or leave them out")
    return address


def run_cluster(comm, pattern: str, serve: Callable[[str], object],
                find_address: Callable[[], str], measure: Callable[[Meeting], object],
                slow_fraction: float = defaults.SLOW_FRACTION) -> ClusterReport | None:
    """Every rank calls this; rank 0 gets the report, the others None."""
    rank, size = comm.Get_rank(), comm.Get_size()
    plan = rounds_of(pairs_of(size, pattern))
    address = ready_everywhere(comm, find_address)
    rows = []
    for pairs in plan:
        for client, server in pairs:
            if rank == server:
                serve_pair(serve, address, comm, client)
            elif rank == client:
                rows.append(measure_pair(measure, comm, server, client))
        comm.Barrier()   # one round at a time: no NIC serves two probes at once
    gathered = comm.gather(rows, root=0)
    if rank != 0:
        return None
    return cluster_report(size, pattern, [row for part in gathered for row in part],
                          slow_fraction)


def cluster_report(size: int, pattern: str, rows: list[ClusterPair],
                   slow_fraction: float) -> ClusterReport:
    """The matrix with the pairs that need a look: failed, not engaged or slow."""
    rows = sorted(rows, key=lambda r: (r.client_rank, r.server_rank))
    measured = [r.host_gbps for r in rows if r.host_gbps]
    median = statistics.median(measured) if measured else None
    flagged = []
    codes = [row.exit_code for row in rows]
    for row in rows:
        if row.error:
            flagged.append(f"ranks {row.client_rank}->{row.server_rank}: {row.error}")
        elif row.verdict not in (None, "engaged"):
            flagged.append(f"ranks {row.client_rank}->{row.server_rank}: GPUDirect RDMA "
                           f"{row.verdict}")
        if median and row.host_gbps and row.host_gbps < slow_fraction * median:
            flagged.append(f"ranks {row.client_rank}->{row.server_rank}: slow, "
                           f"{row.host_gbps:.3f} Gb/s against a median of {median:.3f}")
            codes.append(int(ExitCode.VERDICT_NOT_OK))
    worst = worst_exit_code(codes)
    return ClusterReport(ranks=size, pattern=pattern, pairs=tuple(rows),
                         median_host_gbps=median, slow_fraction=slow_fraction,
                         flagged=tuple(flagged), exit_code=worst or (1 if flagged else 0))
