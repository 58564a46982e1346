"""gdrprobe: prove, in-process, whether GPUDirect RDMA is engaged.

This module is the one door: every capability of the command line is a function here,
and the command line (gdrprobe.cli) only parses flags, calls these functions and renders
what they return, so both doors behave the same. Each function checks its keywords, builds
its plan from them (:mod:`gdrprobe.campaign.plan`) and hands it to the campaign that runs it;
nothing is assembled here. Defaults come from :mod:`gdrprobe.defaults`; an argument left at
None takes the default there.

Importing the package is cheap: pyverbs and CUDA are loaded only by the layers that need
them, when they are first used.
"""

from __future__ import annotations

import os

from gdrprobe import defaults
from gdrprobe.campaign.arguments import (check_gpus, check_nccl, check_threshold_given,
                                         check_token, check_verdict, latency_rows,
                                         percent_habit)
from gdrprobe.defaults import TOKEN_ENV
from gdrprobe.errors import ExitCode, GdrprobeError, UsageError

__version__ = "0.1.0"

__all__ = ["ExitCode", "GdrprobeError", "__version__", "list_devices", "run", "serve",
           "server", "check", "check_node", "require", "bench", "cluster", "diagnose", "capture",
           "read_nccl_log", "new_token", "token_warning", "TOKEN_ENV", "limits"]


# ---- what the machine has ---------------------------------------------------------------


def list_devices(device: str | None = None):
    """Inventory of the RDMA devices: a :class:`gdrprobe.report.model.DeviceReport`."""
    from gdrprobe.rdma.devices import list_devices as _list_devices

    return _list_devices(device)


def diagnose(root: str = "/", nccl: str | None = None):
    """Every prerequisite check (``gdrprobe doctor``): a
    :class:`gdrprobe.report.model.DoctorReport` (its ``exit_code`` is 1 when a check
    failed). ``nccl``: the libnccl the job loads, or its Python (an interpreter, a virtual
    environment or a site-packages directory); unset, it is found as the loader would find
    it. Not named doctor: that name is the gdrprobe.doctor package's, which importing it
    binds on this module."""
    from gdrprobe.doctor.capture import check_root
    from gdrprobe.doctor.runner import run_doctor

    check_root(root)
    check_nccl(nccl, root)
    return run_doctor(root, nccl=nccl)


def capture(dest: str, root: str = "/", replace: bool = False, nccl: str | None = None) -> list[str]:
    """Copy the files the doctor reads into dest, a new or empty directory (replace=True:
    or an earlier capture, replaced once the new one is complete; nothing is ever merged);
    returns the paths copied. ``nccl``: as for :func:`diagnose`, kept for the replay."""
    from gdrprobe.doctor.capture import capture as _capture

    check_nccl(nccl, root)
    return _capture(dest, root=root, replace=replace, nccl=nccl)


def read_nccl_log(path: str, lines: bool = False):
    """What an NCCL_DEBUG=INFO log at path ("-": standard input) proves: a
    :class:`gdrprobe.report.nccl_log.NcclLogReport` (its ``exit_code`` is 1 when network
    channels ran and none used GPUDirect RDMA, or GDR was off on every NIC; 9 when its
    network lines could not be read). The file is streamed;
    ``lines=True`` keeps every network channel line in the report. Raises UsageError for a
    file that cannot be read, is empty or binary, or holds no NCCL line."""
    from gdrprobe.nccl.log import read_nccl_log as _read_nccl_log

    return _read_nccl_log(path, lines=lines)


def limits() -> dict[str, tuple[float, float]]:
    """The valid range (lowest, highest) of each run setting that has one, read from where
    it is defined: the run engine's bounds and the C loop's (loads the native extension)."""
    from gdrprobe.measure import options

    return {"timeout_s": (options.MIN_TIMEOUT_S, options.MAX_TIMEOUT_S),
            "qps": (1, options.MAX_QPS)}


# ---- tokens -------------------------------------------------------------------------------


def new_token() -> str:
    """A random token for a server: 144 random bits, always over the token floor."""
    from gdrprobe.protocol.token import new_token as _new_token

    return _new_token()


def token_warning(token: str) -> str | None:
    """Why run() and server() refuse a token (not UTF-8, over 256 characters, or under the
    floor of 92 bits: SECURITY.md), or None."""
    from gdrprobe.protocol.token import token_problem

    return token_problem(token)


# ---- one run, and the A/B -----------------------------------------------------------------


def run(host: str | None = None, *, token: str | None = None, loopback: bool = False,
        port: int | None = None, device: str | None = None, ib_port: int = 1,
        gid_index: int | None = None, mem: str = "host", remote_mem: str | None = None,
        gpu: str = "0", gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
        pcie_mapping: bool = False, huge_pages: bool = False, staged: bool = False,
        repeats: int = defaults.REPEATS, threshold: float = defaults.THRESHOLD,
        size: int | None = None, connect_wait_s: float = 0.0, on_result=None, notice=None,
        gpu_alloc: str = defaults.GPU_ALLOCATION, flush: bool = False,
        pattern: str | None = None, **settings):
    """A probe against ``gdrprobe serve`` on host (or, with loopback=True, both ends in
    this process). mem and remote_mem are host, gpu, dmabuf, peermem or staged; gpu
    registers a buffer of this host as NCCL registers that GPU's memory (DMA-BUF or peer
    memory, by the doctor's decision), else as the GPU and NIC allow.

    With a GPU buffer at either end this is the A/B (host arm against GPU arm, `repeats`
    times, plus the staged arm with staged=True) and returns a
    :class:`gdrprobe.report.model.CheckReport`; otherwise one run and a
    :class:`gdrprobe.report.model.RunReport`. settings are
    :class:`gdrprobe.measure.options.ProbeOptions` fields (mode, sizes, iterations,
    duration_s, qps, tx_depth, cq_moderation, post_list, mtu, timeout_s, clock, ...);
    on_result(result) sees each size's result as it is measured (with bidir,
    on_result(result, reverse): the server's WRITEs of the same window too), notice(text) what a
    person may want to know while it runs (on_result: a single run only; the A/B reports
    its arms in its own report). flush=True: the receiver of a GPU buffer flushes it as
    NCCL does (an RDMA READ of the last message's first byte on a loopback QP) before each
    check, and the report says so (check() follows NCCL's rules for that by itself).
    mode="latency" with a GPU buffer and opcode="write_imm" (or opcode="read" with the GPU
    buffer at the remote end) is the latency A/B instead
    (:class:`gdrprobe.report.model.LatencyABReport`: each size's GPU/host median ratio).
    pattern="nccl": each size's stream, then NCCL's pattern (``nccl``, ``nccl_answers``; an
    A/B's ``pattern`` joins its verdict: docs/method.md). Raises :class:`GdrprobeError`."""
    from gdrprobe.campaign import probe
    from gdrprobe.campaign.plan import Buffer, endpoint, peer

    if bool(host) == bool(loopback):
        raise UsageError("give either a server host or loopback", "e.g. 'gdrprobe run "
                         "10.0.0.2 --token TOKEN' or 'gdrprobe run --loopback'")
    check_verdict(threshold, repeats)
    check_gpus(gpu)
    details = dict(memory_type=gpu_mem_type, allocation=gpu_alloc, pcie_mapping=pcie_mapping,
                   huge_pages=huge_pages)
    return probe.run(probe.RunPlan(
        local=Buffer(mem, **details).spec(gpu),
        remote=Buffer(remote_mem, **details).spec(gpu) if remote_mem else None,
        endpoint=endpoint(device, ib_port, gid_index), peer=peer(host, port, token),
        settings=settings, size=size, repeats=repeats, threshold=threshold, staged=staged,
        connect_wait_s=connect_wait_s, flush=flush, pattern=pattern), on_result, notice)


# ---- serving ------------------------------------------------------------------------------


def server(token: str, *, bind: str = defaults.BIND, port: int | None = None,
           device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
           mem: str = "host", gpu: str = "0", gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
           pcie_mapping: bool = False, huge_pages: bool = False,
           max_buffer: int = defaults.MAX_BUFFER, timeout_s: float = defaults.TIMEOUT_S,
           gpu_alloc: str = defaults.GPU_ALLOCATION):
    """A server listening for clients that know token (:func:`new_token` makes one), its
    buffer of kind mem unless a client asks for another: call ``.serve(runs)`` on it, and
    ``.close()``; ``.port`` is the port it listens on (port=0: any free one). Clients whose
    GPU arm uses this host's GPU buffer get this host's doctor findings."""
    from gdrprobe.campaign.machine import served_findings
    from gdrprobe.campaign.plan import Buffer, endpoint, tcp_port
    from gdrprobe.measure.server import ProbeServer

    check_token(token, required=True)
    check_gpus(gpu)
    memory = Buffer(mem, memory_type=gpu_mem_type, allocation=gpu_alloc,
                    pcie_mapping=pcie_mapping, huge_pages=huge_pages).spec(gpu)
    return ProbeServer(token, endpoint(device, ib_port, gid_index), bind=bind,
                       port=tcp_port(port), timeout_s=timeout_s, max_buffer=max_buffer,
                       memory=memory, findings=served_findings())


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
          gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
          gpu_alloc: str | None = None, staged: bool = False,
          repeats: int = defaults.REPEATS, threshold: float = defaults.THRESHOLD,
          floor: float = defaults.FLOOR,
          time_budget_s: float | None = defaults.CHECK_TIME_BUDGET_S, size: int | None = None,
          latency: bool = False, read: bool = False, bidir: bool = False,
          latency_factor: float | None = None, gin: bool = False, pattern: str | None = None,
          **settings):
    """The A/B and its verdict as NCCL will move this GPU's bytes: GPU memory at both ends
    on the local NIC in loopback (the NIC reads one GPU buffer and writes another; where
    that falls short, one arm per direction names the one that fails), or against host.
    Without gpu and device, the pair this process's rank will use: the GPU from LOCAL_RANK
    (torchrun), SLURM_LOCALID (srun) or OMPI_COMM_WORLD_LOCAL_RANK among the GPUs
    CUDA_VISIBLE_DEVICES leaves, the NIC NCCL will use for it (decided among the job's GPUs
    on this node, as NCCL counts its communicator's: :mod:`gdrprobe.campaign.communicator`),
    and with PXN the NVLink peer's memory for the sends; ``report.placement`` says which and
    why. With mem="gpu"
    the memory is registered as NCCL will register it (DMA-BUF or peer memory: its release,
    NCCL_DMABUF_ENABLE, the GPU and the NIC decide); dmabuf and peermem as named. NCCL's own
    decision for the GPU joins the verdict: "not used by NCCL" where NCCL will not use
    GPUDirect for it (exit 10 for an NCCL setting, 1 for the node). floor: the fraction of
    the port's line rate the GPU arm must reach (hardware NICs whose rate is known; 0: no
    floor). gpu_alloc: vmm or malloc; None: as NCCL will allocate (NCCL_CUMEM_ENABLE).
    QPs default to CHECK_QPS. Sampling stops as soon as the verdict is clear (2
    repeats at least, `repeats` at most). time_budget_s (default CHECK_TIME_BUDGET_S; None:
    no limit) is a hard limit on the whole check, doctor, set-up and waiting for another
    check of the same NIC included. Where the A/B is engaged, latency=True adds the latency
    A/B (``report.latency``: "latency degraded" where the GPU memory's median is over the
    host memory's by more than latency_factor, default LATENCY_FACTOR, in every repeat's
    pair; "inconclusive" where only in some) and read=True the A/B
    with RDMA READ (``report.read``: "GDR read degraded", NCCL_NET_GDR_READ=0 named), bidir=True
    the A/B with both ends WRITEing at once (``report.bidir``, the same answer); each
    shortfall is a warning in ``verdict.warnings`` (exit 13), never a drain. gin=True adds,
    whatever the A/B's answer, the registration NCCL's GIN makes of the NIC's doorbell page
    for the GPU (``report.gin``: refused is exit 13, or 1 where the job asked for GIN
    explicitly; docs/check.md). pattern="nccl", where engaged, the A/B in NCCL's own traffic
    pattern (``report.pattern``), a GPU arm whose pattern falls below the host arm's degraded.
    NCCL's flush, where it ran, is ``report.flush``. Returns a
    :class:`gdrprobe.report.model.CheckReport`."""
    from gdrprobe.campaign.plan import Buffer, CheckPlan, Criteria, endpoint, gate_options, peer
    from gdrprobe.campaign.prelaunch import check_rank

    check_gpus(gpu)
    options, given = gate_options(size, settings)
    return check_rank(CheckPlan(
        options, given=given, send=Buffer(mem, gpu_mem_type, gpu_alloc),
        receive=Buffer(remote_mem or (mem if host is None else "host"), gpu_mem_type, gpu_alloc),
        criteria=Criteria.asked(threshold=threshold, floor=floor, repeats=repeats,
                                latency_factor=latency_factor,
                                latency=latency, read=read, bidir=bidir, gin=gin,
                                pattern=pattern),
        endpoint=endpoint(device, ib_port, gid_index), peer=peer(host, port, token),
        staged=staged, time_budget_s=time_budget_s), gpu, os.environ)


def check_node(*, gpus: str | None = None, ib_port: int = 1, gid_index: int | None = None,
               mem: str = defaults.GPU_MEMORY, gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
               gpu_alloc: str | None = None, staged: bool = False,
               repeats: int = defaults.REPEATS,
               threshold: float = defaults.THRESHOLD, floor: float = defaults.FLOOR,
               time_budget_s: float | None = defaults.CHECK_TIME_BUDGET_S,
               size: int | None = None, all_rails: bool = False, latency: bool = False,
               read: bool = False, bidir: bool = False, latency_factor: float | None = None,
               gin: bool = False, pattern: str | None = None, **settings):
    """:func:`check` for every GPU of the job with the NIC NCCL will use for it, in one
    process (one doctor, one CUDA start-up): GPUs sharing a NIC one after the other, NICs in
    parallel as far as the locked-memory limit holds them (``report.memlock`` says how it
    fitted them), all inside time_budget_s; latency, read, bidir, latency_factor, gin and
    pattern as in check().
    The job's GPUs: gpus (comma-separated CUDA
    ordinals, bus ids or UUIDs), else SLURM_STEP_GPUS, SLURM_JOB_GPUS,
    NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, the first set; else every GPU of the
    node (:mod:`gdrprobe.campaign.job_gpus`). Returns a
    :class:`gdrprobe.report.model.NodeCheckReport`: one entry per GPU, and ``exit_code``
    the worst of theirs (a drain before a warn). all_rails (on an idle node): the NICs one
    at a time, then every rail at once (:mod:`gdrprobe.campaign.rails`); ``report.rails``
    holds each rail solo, together and their ratio, the aggregate and the verdict
    ("contention": exit 13, a warning; rails that did not run together: 12)."""
    from gdrprobe.campaign.node import check_job
    from gdrprobe.campaign.plan import Buffer, CheckPlan, Criteria, endpoint, gate_options

    options, given = gate_options(size, settings)
    return check_job(CheckPlan(
        options, given=given, send=Buffer(mem, gpu_mem_type, gpu_alloc),
        receive=Buffer(mem, gpu_mem_type, gpu_alloc),
        criteria=Criteria.asked(threshold=threshold, floor=floor, repeats=repeats,
                                latency_factor=latency_factor,
                                latency=latency, read=read, bidir=bidir, gin=gin,
                                pattern=pattern),
        endpoint=endpoint(None, ib_port, gid_index), staged=staged,
        time_budget_s=time_budget_s), gpus, all_rails, os.environ)


def require(**kwargs):
    """:func:`check`, raising unless GPUDirect RDMA is engaged: a prelaunch gate for a
    training job. Returns the report when engaged (exit 0, or 13: engaged with a warning
    from latency=True or read=True, never a reason to stop the job); raises VerdictNotOk (exit 1:
    degraded, not engaged, or NCCL's rules refuse it on this node), NcclSetting (10: an NCCL
    setting keeps NCCL off it), NotTestable (9) or Inconclusive (12: the measurement could
    not tell, however its median leaned)."""
    from gdrprobe.campaign.prelaunch import engaged

    return engaged(check(**kwargs))


# ---- the benchmark sweep and the cluster matrix -------------------------------------------


def bench(*, sizes=None, memory=defaults.BENCH_MEMORY, qps=(defaults.QPS,),
          matrix: bool = False, gpus=(), devices=(), ib_port: int = 1,
          gid_index: int | None = None, iterations: int = defaults.ITERATIONS,
          duration_s: float | None = None, warmup_s: float = defaults.WARMUP_S,
          tx_depth: int = defaults.TX_DEPTH, cq_moderation: int = defaults.CQ_MODERATION,
          latency_iterations: int | None = defaults.LATENCY_ITERATIONS,
          threshold: float = defaults.THRESHOLD, timeout_s: float = defaults.TIMEOUT_S,
          baseline: str | None = None, max_drop: float = defaults.MAX_DROP, on_row=None,
          opcode: str = "write", bidir: bool = False, all_rails: bool = False,
          pattern: str | None = None):
    """The microbenchmark sweep in loopback: message sizes (default 2 B to 8 MiB) x memory
    kinds x QP counts x GPU-NIC pairs (each GPU with the NIC NCCL gives it; matrix=True:
    every GPU with every NIC), plus host-memory latency per NIC (latency_iterations=None: none).
    A kind that cannot run here becomes rows with its outcome. on_row(row, rows_done,
    rows_planned) sees each :class:`gdrprobe.report.model.BenchRow` as it is measured;
    Ctrl-C ends the sweep with the rows so far (``report.interrupted``). baseline: an
    earlier sweep's JSON file, read before anything is measured; each row that fell by more
    than max_drop is flagged (``report.baseline``). opcode="read": every run measures RDMA
    READ (perftest's ib_read_bw and ib_read_lat) instead of WRITE. bidir=True: both sides
    WRITE at once in every bandwidth run (perftest's -b; a number of iterations, so no
    duration_s): each row's ``reverse_gbps`` and ``bidir_sum_gbps``. all_rails (an idle
    node): after the sweep, every rail's GPU kind and host memory at once at the largest
    size and QP count, each against its own sweep row (``report.rails``; docs/check.md).
    pattern="nccl": each bandwidth size also as NCCL's steps (rows' ``nccl_*``; NCCL's step
    sizes unless given). Returns a :class:`gdrprobe.report.model.BenchReport`; its ``exit_code`` is 1 when a row
    fell, else with all_rails the rails' (13 contention, 12 inconclusive)."""
    from gdrprobe.campaign.bench import bench as sweep
    from gdrprobe.report.model import BenchSettings

    check_threshold_given(threshold)
    percent_habit("--max-drop", max_drop)
    check_gpus(*_as_tuple(gpus))
    settings = BenchSettings(
        sizes_bytes=_as_tuple(sizes or (() if pattern else defaults.SWEEP_SIZES)),
        memory_kinds=_as_tuple(memory),
        qps=_as_tuple(qps), matrix=matrix, iterations=iterations, duration_s=duration_s,
        warmup_s=warmup_s, tx_depth=tx_depth, cq_moderation=cq_moderation,
        latency_iterations=latency_rows(latency_iterations), threshold=threshold,
        ib_port=ib_port, opcode=opcode, bidir=bidir, all_rails=all_rails, pattern=pattern or "")
    return sweep(settings, __version__, gpus=_as_tuple(gpus), devices=_as_tuple(devices),
                 gid_index=gid_index, timeout_s=timeout_s, on_row=on_row, baseline=baseline,
                 max_drop=max_drop)


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
            timeout_s: float = defaults.TIMEOUT_S, oob_address: str | None = None,
            gpu_alloc: str = defaults.GPU_ALLOCATION, bidir: bool = False):
    """Every pair of nodes of the MPI job this process is a rank of (one rank per node):
    call it on every rank. Rank 0 gets the :class:`gdrprobe.report.model.ClusterReport`
    (its ``exit_code`` is the worst pair's; a slow pair alone: 1), the other ranks None.
    bidir=True: both ranks of a pair WRITE at once in one window (perftest's -b); each
    pair's ``bidirectional`` has per arm each direction and the sum."""
    from gdrprobe.campaign.cluster import ClusterPlan, cluster as every_pair
    from gdrprobe.campaign.plan import Buffer, endpoint

    check_verdict(threshold, repeats)
    check_gpus(gpu)
    local = Buffer(mem, memory_type=gpu_mem_type, allocation=gpu_alloc,
                   pcie_mapping=pcie_mapping, huge_pages=huge_pages).spec(gpu)
    return every_pair(ClusterPlan(
        local, endpoint(device, ib_port, gid_index), pattern=pattern, size=size,
        iterations=iterations, timeout_s=timeout_s, bidir=bidir, repeats=repeats,
        threshold=threshold, slow_fraction=slow_fraction, oob_address=oob_address))
