"""gdrprobe: prove, in-process, whether GPUDirect RDMA is engaged.

This module is the one door: every capability of the command line is a function here,
and the command line (gdrprobe.cli) only parses flags, calls these functions and renders
what they return, so both doors behave the same. Defaults come from
:mod:`gdrprobe.defaults`; an argument left at None takes the default there.

Importing the package is cheap: pyverbs and CUDA are loaded only by the layers that need
them, when they are first used.
"""

from __future__ import annotations

import os

from gdrprobe import defaults
from gdrprobe.errors import ExitCode, GdrprobeError, UsageError

__version__ = "0.1.0"

__all__ = ["ExitCode", "GdrprobeError", "__version__", "list_devices", "run", "serve",
           "server", "check", "require", "bench", "cluster", "diagnose", "capture",
           "read_nccl_log", "new_token", "token_warning", "TOKEN_ENV"]

TOKEN_ENV = "GDRPROBE_TOKEN"   # where the command line looks for a token it was not given
TOKEN_LENGTHS = (8, 256)


# ---- what the machine has ---------------------------------------------------------------


def list_devices(device: str | None = None):
    """Inventory of the RDMA devices: a :class:`gdrprobe.report.model.DeviceReport`."""
    from gdrprobe.rdma.devices import list_devices as _list_devices

    return _list_devices(device)


def diagnose(root: str = "/"):
    """Every prerequisite check (``gdrprobe doctor``): a
    :class:`gdrprobe.report.model.DoctorReport` (its ``exit_code`` is 1 when a check
    failed). Not named doctor: that name is the gdrprobe.doctor package's, which importing
    it binds on this module."""
    from gdrprobe.doctor.runner import run_doctor

    return run_doctor(root)


def capture(dest: str, root: str = "/") -> list[str]:
    """Copy the files the doctor reads into dest; returns the paths copied."""
    from gdrprobe.doctor.capture import capture as _capture

    return _capture(dest, root=root)


def read_nccl_log(path: str):
    """What an NCCL_DEBUG=INFO log proves: a :class:`gdrprobe.report.model.NcclLogReport`
    (its ``exit_code`` is 1 when network channels ran and none used GPUDirect RDMA)."""
    from gdrprobe.nccl.log import read_nccl_log as _read_nccl_log

    return _read_nccl_log(path)


# ---- tokens -------------------------------------------------------------------------------


def new_token() -> str:
    """A random token for a server."""
    from gdrprobe.protocol.channel import new_token as _new_token

    return _new_token()


def token_warning(token: str) -> str | None:
    """Why a token chosen by a person is weak, or None."""
    from gdrprobe.protocol.channel import token_warning as _token_warning

    return _token_warning(token)


def _check_token(token: str | None, required: bool) -> None:
    low, high = TOKEN_LENGTHS
    if required and not token:
        raise UsageError("no token: the server only talks to clients that know its token",
                         f"pass --token TOKEN (printed by 'gdrprobe serve') or set {TOKEN_ENV}")
    if token is not None and not low <= len(token) <= high:
        raise UsageError(f"the token must be {low} to {high} characters",
                         "use the one the server printed")


# ---- the pieces every run is made of ------------------------------------------------------


def _endpoint(device: str | None, ib_port: int, gid_index: int | None):
    from gdrprobe.rdma.endpoint import EndpointOptions

    if not 1 <= ib_port <= 255:
        raise UsageError(f"--ib-port {ib_port} is not a port number", "use 1 or 2")
    return EndpointOptions(device=device, port=ib_port, gid_index=gid_index)


def _memory(choice: str, gpu: str = "0", gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
            pcie_mapping: bool = False, huge_pages: bool = False):
    from gdrprobe.memory.spec import MemorySpec

    return MemorySpec.from_choice(choice, gpu=gpu, memory_type=gpu_mem_type,
                                  pcie_mapping=pcie_mapping, huge_pages=huge_pages)


def _options(a_b: bool, size: int | None, settings: dict):
    """A run's options: the A/B compares bandwidth at large messages (A_B_SIZE) unless a
    size is given; registration follows NCCL_IB_PCI_RELAXED_ORDERING as NCCL does unless
    relaxed_ordering is given; the rest is ProbeOptions' own (gdrprobe.defaults)."""
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.nccl.env import relaxed_ordering_wanted

    settings = {key: value for key, value in settings.items() if value is not None}
    if "sizes" not in settings:
        settings["sizes"] = (size or (defaults.A_B_SIZE if a_b else defaults.SIZE),)
    settings.setdefault("relaxed_ordering", relaxed_ordering_wanted(os.environ))
    return ProbeOptions(**settings)


def _port(port: int | None) -> int:
    return defaults.PORT if port is None else port


# ---- one run, and the A/B -----------------------------------------------------------------


def run(host: str | None = None, *, token: str | None = None, loopback: bool = False,
        port: int | None = None, device: str | None = None, ib_port: int = 1,
        gid_index: int | None = None, mem: str = "host", remote_mem: str | None = None,
        gpu: str = "0", gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
        pcie_mapping: bool = False, huge_pages: bool = False, staged: bool = False,
        repeats: int = defaults.REPEATS, threshold: float = defaults.THRESHOLD,
        size: int | None = None, connect_wait_s: float = 0.0, on_result=None, notice=None,
        **settings):
    """A probe against ``gdrprobe serve`` on host (or, with loopback=True, both ends in
    this process). mem and remote_mem are host, gpu, dmabuf, peermem or staged.

    With a GPU buffer at either end this is the A/B (host arm against GPU arm, `repeats`
    times, plus the staged arm with staged=True) and returns a
    :class:`gdrprobe.report.model.CheckReport`; otherwise one run and a
    :class:`gdrprobe.report.model.RunReport`. settings are
    :class:`gdrprobe.measure.options.ProbeOptions` fields (mode, sizes, iterations,
    duration_s, qps, tx_depth, cq_moderation, post_list, mtu, timeout_s, clock, ...);
    on_result(result) sees each size's result as it is measured, notice(text) what a
    person may want to know while it runs (on_result: a single run only; the A/B reports
    its arms in its own report). Raises :class:`GdrprobeError`."""
    from gdrprobe.campaign.ab import ab_test
    from gdrprobe.campaign.machine import doctor_findings
    from gdrprobe.measure.loopback import runner

    if bool(host) == bool(loopback):
        raise UsageError("give either a server host or loopback", "e.g. 'gdrprobe run "
                         "10.0.0.2 --token TOKEN' or 'gdrprobe run --loopback'")
    _check_token(None if loopback else token, required=not loopback)
    if not 0 <= connect_wait_s <= 3600:
        raise UsageError("--connect-wait must be 0 to 3600 s", "")
    local = _memory(mem, gpu, gpu_mem_type, pcie_mapping, huge_pages)
    remote = _memory(remote_mem, gpu, gpu_mem_type, pcie_mapping, huge_pages) \
        if remote_mem else None
    a_b = local.kind == "gpu" or (remote is not None and remote.kind == "gpu")
    if a_b and settings.get("mode") == "latency":
        raise UsageError("the GPU A/B measures bandwidth; latency runs use host memory",
                         "drop --latency, or drop --mem/--remote-mem")
    probe = runner(_options(a_b, size, settings), _endpoint(device, ib_port, gid_index),
                   None if loopback else host, _port(port), token, connect_wait_s,
                   on_result=None if a_b else on_result, notice=notice)
    if not a_b:
        return probe(local, remote)
    return ab_test(probe, local, remote, staged=staged, repeats=repeats,
                   threshold=threshold, doctor_findings=doctor_findings(local, loopback))


# ---- serving ------------------------------------------------------------------------------


def server(token: str, *, bind: str = defaults.BIND, port: int | None = None,
           device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
           mem: str = "host", gpu: str = "0", gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
           pcie_mapping: bool = False, huge_pages: bool = False,
           max_buffer: int = defaults.MAX_BUFFER, timeout_s: float = defaults.TIMEOUT_S):
    """A server listening for clients that know token (:func:`new_token` makes one), its
    buffer of kind mem unless a client asks for another: call ``.serve(runs)`` on it, and
    ``.close()``; ``.port`` is the port it listens on (port=0: any free one). Clients whose
    GPU arm uses this host's GPU buffer get this host's doctor findings."""
    from gdrprobe.campaign.machine import served_findings
    from gdrprobe.measure.server import ProbeServer

    _check_token(token, required=True)
    return ProbeServer(token, _endpoint(device, ib_port, gid_index), bind=bind,
                       port=_port(port), timeout_s=timeout_s, max_buffer=max_buffer,
                       memory=_memory(mem, gpu, gpu_mem_type, pcie_mapping, huge_pages),
                       findings=served_findings())


def serve(token: str, *, runs: int | None = None, **options) -> None:
    """Serve probe runs to clients that know token: forever, or `runs` runs. options are
    :func:`server`'s."""
    listening = server(token, **options)
    try:
        listening.serve(runs)
    finally:
        listening.close()


# ---- the prelaunch gate -------------------------------------------------------------------


def check(host: str | None = None, *, token: str | None = None, port: int | None = None,
          device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
          mem: str = defaults.GPU_MEMORY, remote_mem: str | None = None, gpu: str | None = None,
          gpu_mem_type: str = defaults.GPU_MEMORY_TYPE, staged: bool = False,
          repeats: int = defaults.REPEATS, threshold: float = defaults.THRESHOLD,
          time_budget_s: float | None = defaults.CHECK_TIME_BUDGET_S, size: int | None = None,
          **settings):
    """The A/B and its verdict: the host arm against the GPU arm on the local NIC in
    loopback (or against host). Without gpu and device, the pair this process's rank will
    use: the GPU from LOCAL_RANK (torchrun), SLURM_LOCALID (srun) or
    OMPI_COMM_WORLD_LOCAL_RANK among the GPUs CUDA_VISIBLE_DEVICES leaves, and the NIC NCCL
    will use for it; ``report.placement`` says which and why. Sampling stops as soon as the
    verdict is clear (2 repeats at least, `repeats` at most; a GPU arm that cannot run ends
    it after one host run). time_budget_s (default CHECK_TIME_BUDGET_S; None: no limit)
    is a hard limit on the whole check, doctor and set-up included: runs are
    fixed-duration runs sized to it, and no run starts that it cannot hold. Returns a
    :class:`gdrprobe.report.model.CheckReport`; its ``verdict.classification`` is
    engaged, degraded, not engaged or not testable."""
    import dataclasses

    from gdrprobe.campaign.ab import ab_test
    from gdrprobe.campaign.gate import Budget, budgeted, rank_pair, sized_for_budget
    from gdrprobe.campaign.machine import holds_gpu_buffer, machine_facts
    from gdrprobe.measure.loopback import runner

    budget = Budget(time_budget_s)
    if settings.get("mode", "bandwidth") != "bandwidth":
        raise UsageError("check() compares bandwidth; latency runs use host memory", "")
    if host is not None:
        _check_token(token, required=True)
    facts = machine_facts()
    pair = rank_pair(os.environ, facts.gpus, facts.nics, gpu, device)
    options = _options(True, size, settings)
    if time_budget_s is not None:
        options = sized_for_budget(options, time_budget_s, repeats * (3 if staged else 2))
    endpoint = _endpoint(pair.nic, ib_port, gid_index)
    run_once = budgeted(lambda capped: runner(capped, endpoint, host, _port(port), token),
                        options, budget)
    local = _memory(mem, pair.gpu, gpu_mem_type)
    remote = _memory(remote_mem, pair.gpu, gpu_mem_type) if remote_mem else None
    report = ab_test(run_once, local, remote, staged=staged, repeats=repeats,
                     threshold=threshold,
                     doctor_findings=(facts.findings if holds_gpu_buffer(local, host is None)
                                      else ()),
                     min_repeats=min(2, repeats))
    return dataclasses.replace(report, placement=dataclasses.replace(
        pair, time_budget_s=time_budget_s, elapsed_s=round(budget.elapsed(), 3)))


def require(**kwargs):
    """:func:`check`, raising unless GPUDirect RDMA is engaged: a prelaunch gate for a
    training job. Returns the report when engaged."""
    from gdrprobe.errors import NotTestable, VerdictNotOk

    report = check(**kwargs)
    verdict = report.verdict
    if verdict.classification == "engaged":
        return report
    error = NotTestable if verdict.classification == "not testable" else VerdictNotOk
    raise error(f"GPUDirect RDMA is {verdict.classification}"
                + (f" (GPU/host {verdict.ratio:.2f})" if verdict.ratio is not None else ""),
                verdict.fix, evidence="; ".join(verdict.evidence))


# ---- the benchmark sweep and the cluster matrix -------------------------------------------


def bench(*, sizes=None, memory=defaults.BENCH_MEMORY, qps=(defaults.QPS,),
          matrix: bool = False, gpus=(), devices=(), ib_port: int = 1,
          gid_index: int | None = None, iterations: int = defaults.ITERATIONS,
          duration_s: float | None = None, warmup_s: float = defaults.WARMUP_S,
          tx_depth: int = defaults.TX_DEPTH, cq_moderation: int = defaults.CQ_MODERATION,
          latency_iterations: int = defaults.LATENCY_ITERATIONS,
          threshold: float = defaults.THRESHOLD, timeout_s: float = defaults.TIMEOUT_S,
          baseline: str | None = None, max_drop: float = defaults.MAX_DROP, on_row=None):
    """The microbenchmark sweep in loopback: message sizes (default 2 B to 8 MiB) x memory
    kinds x QP counts x GPU-NIC pairs (each GPU with the NIC NCCL gives it; matrix=True:
    every GPU with every NIC), plus host-memory latency per NIC (latency_iterations=0: none).
    A kind that cannot run here becomes rows with its outcome. on_row(row, rows_done,
    rows_planned) sees each :class:`gdrprobe.report.model.BenchRow` as it is measured;
    Ctrl-C ends the sweep with the rows so far (``report.interrupted``). baseline: an
    earlier sweep's JSON file, read before anything is measured; each row that fell by more
    than max_drop is flagged (``report.baseline``). Returns a
    :class:`gdrprobe.report.model.BenchReport`; its ``exit_code`` is 1 when a row fell."""
    import dataclasses

    from gdrprobe.campaign.bench import check_max_drop, compare_rows, run_bench
    from gdrprobe.campaign.machine import machine_facts
    from gdrprobe.report.bench import read_baseline
    from gdrprobe.report.model import BenchSettings

    before = read_baseline(baseline) if baseline else None
    check_max_drop(max_drop)
    settings = BenchSettings(
        sizes_bytes=_as_tuple(sizes or defaults.SWEEP_SIZES), memory_kinds=_as_tuple(memory),
        qps=_as_tuple(qps), matrix=matrix, iterations=iterations, duration_s=duration_s,
        warmup_s=warmup_s, tx_depth=tx_depth, cq_moderation=cq_moderation,
        latency_iterations=latency_iterations, threshold=threshold, ib_port=ib_port)
    report = run_bench(settings, machine_facts(), __version__, gpus=_as_tuple(gpus),
                       devices=_as_tuple(devices), gid_index=gid_index, timeout_s=timeout_s,
                       on_row=on_row or (lambda row, done, total: None))
    if before is None:
        return report
    return dataclasses.replace(report, baseline=compare_rows(report.rows, before, baseline,
                                                             max_drop))


def _as_tuple(value) -> tuple:
    """One value or several: bench(memory="host") as bench(memory=("host",))."""
    return (value,) if isinstance(value, (str, int)) else tuple(value)


def cluster(*, pattern: str = "all", mem: str = defaults.GPU_MEMORY, gpu: str = "0",
            gpu_mem_type: str = defaults.GPU_MEMORY_TYPE, pcie_mapping: bool = False,
            huge_pages: bool = False, device: str | None = None, ib_port: int = 1,
            gid_index: int | None = None, size: int = defaults.A_B_SIZE,
            iterations: int = defaults.ITERATIONS, repeats: int = defaults.REPEATS,
            threshold: float = defaults.THRESHOLD,
            slow_fraction: float = defaults.SLOW_FRACTION,
            timeout_s: float = defaults.TIMEOUT_S, oob_address: str | None = None):
    """Every pair of nodes of the MPI job this process is a rank of (one rank per node):
    call it on every rank. Rank 0 gets the :class:`gdrprobe.report.model.ClusterReport`
    (its ``exit_code`` is the worst pair's; a slow pair alone: 1), the other ranks None."""
    from gdrprobe.campaign import cluster as _cluster
    from gdrprobe.campaign.machine import doctor_findings

    if not 0 < slow_fraction <= 1:
        raise UsageError(f"--slow-fraction {slow_fraction}: use a fraction over 0 and at "
                         "most 1", f"e.g. {defaults.SLOW_FRACTION}")
    endpoint = _endpoint(device, ib_port, gid_index)
    local = _memory(mem, gpu, gpu_mem_type, pcie_mapping, huge_pages)
    options = _options(True, size, {"iterations": iterations, "timeout_s": timeout_s})
    return _cluster.run_cluster(
        _cluster.world(), pattern, _cluster.pair_server(endpoint, timeout_s),
        lambda: _cluster.advertised_address(endpoint, oob_address),
        _cluster.pair_probe(options, endpoint, local, repeats, threshold,
                            doctor_findings(local, loopback=False)),
        slow_fraction)
