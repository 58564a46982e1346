"""gdrprobe: prove, in-process, whether GPUDirect RDMA is engaged.

Importing the package is cheap: pyverbs and CUDA are loaded only by the
layers that need them, when they are first used. The functions below are the Python
face of the command line; each returns the same report objects the CLI prints.
"""

from __future__ import annotations

from gdrprobe.errors import ExitCode, GdrprobeError

__version__ = "0.1.0"

__all__ = ["ExitCode", "GdrprobeError", "__version__", "list_devices", "run", "serve",
           "check", "require", "bench", "cluster", "doctor", "capture", "read_nccl_log"]


def list_devices(device: str | None = None):
    """Inventory of the RDMA devices: a :class:`gdrprobe.report.model.DeviceReport`."""
    from gdrprobe.rdma.devices import list_devices as _list_devices

    return _list_devices(device)


def _runner(host, token, loopback, port, device, ib_port, gid_index, settings):
    from gdrprobe.rdma.endpoint import EndpointOptions
    from gdrprobe.errors import UsageError
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.measure.session import DEFAULT_PORT, runner

    if not loopback and (not host or not token):
        raise UsageError("give a host and the server's token, or loopback=True")
    endpoint = EndpointOptions(device=device, port=ib_port, gid_index=gid_index)
    return runner(ProbeOptions(**settings), endpoint, None if loopback else host,
                  DEFAULT_PORT if port is None else port, token)


def _memory(choice: str | None, gpu: str, gpu_mem_type: str):
    from gdrprobe.memory.spec import MemorySpec

    if choice is None:
        return None
    return MemorySpec.from_choice(choice, gpu=gpu, memory_type=gpu_mem_type)


def run(host: str | None = None, *, token: str | None = None, loopback: bool = False,
        port: int | None = None, device: str | None = None, ib_port: int = 1,
        gid_index: int | None = None, mem: str = "host", remote_mem: str | None = None,
        gpu: str = "0", gpu_mem_type: str = "device", **settings):
    """One probe against ``gdrprobe serve`` on host (or, with loopback=True, both ends in
    this process). settings are :class:`gdrprobe.measure.options.ProbeOptions` fields (mode, sizes,
    iterations, duration_s, qps, tx_depth, cq_moderation, post_list, mtu, timeout_s,
    clock);
    mem and remote_mem are host, gpu, dmabuf, peermem or staged.
    Returns a :class:`gdrprobe.report.model.RunReport`; raises :class:`GdrprobeError`."""
    probe = _runner(host, token, loopback, port, device, ib_port, gid_index, settings)
    return probe(_memory(mem, gpu, gpu_mem_type), _memory(remote_mem, gpu, gpu_mem_type))


def check(host: str | None = None, *, token: str | None = None, port: int | None = None,
          device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
          mem: str = "gpu", remote_mem: str | None = None, gpu: str | None = None,
          gpu_mem_type: str = "device", staged: bool = False, repeats: int = 3,
          threshold: float = 0.9, time_budget_s: float | None = None, **settings):
    """The A/B and its verdict: the host arm against the GPU arm on the local NIC in
    loopback (or against host). Without gpu and device, the pair this process's rank will
    use: the GPU from LOCAL_RANK (torchrun), SLURM_LOCALID (srun) or
    OMPI_COMM_WORLD_LOCAL_RANK among the GPUs CUDA_VISIBLE_DEVICES leaves, and the NIC NCCL
    will use for it; ``report.placement`` says which and why. Sampling stops as soon as the
    verdict is clear (2 repeats at least, `repeats` at most; a GPU arm that cannot run ends
    it after one host run). time_budget_s is a hard limit on the whole check, doctor and
    set-up included: runs are fixed-duration runs sized to it, and no run starts that it
    cannot hold. Returns a :class:`gdrprobe.report.model.CheckReport`; its
    ``verdict.classification`` is engaged, degraded, not engaged or not testable."""
    import dataclasses
    import os

    from gdrprobe.errors import UsageError
    from gdrprobe.campaign.ab import ab_test
    from gdrprobe.campaign.gate import Budget, budgeted, rank_pair, sized_for_budget
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.measure.session import DEFAULT_PORT, runner
    from gdrprobe.rdma.endpoint import EndpointOptions

    budget = Budget(time_budget_s)
    if settings.get("mode", "bandwidth") != "bandwidth":
        raise UsageError("check() compares bandwidth; latency runs use host memory", "")
    if host is not None and not token:
        raise UsageError("give the server's token with its host, or no host for loopback", "")
    facts = _machine_facts()
    pair = rank_pair(os.environ, facts.gpus, facts.nics, gpu, device)
    options = ProbeOptions(**{"sizes": (1 << 20,), **settings})
    if time_budget_s is not None:
        options = sized_for_budget(options, time_budget_s, repeats * (3 if staged else 2))
    endpoint = EndpointOptions(device=pair.nic, port=ib_port, gid_index=gid_index)
    server_port = DEFAULT_PORT if port is None else port
    run_once = budgeted(lambda capped: runner(capped, endpoint, host, server_port, token),
                        options, budget)
    local = _memory(mem, pair.gpu, gpu_mem_type)
    # The doctor speaks for this host's GPU (in loopback the server's buffer is here too);
    # a server sends its own findings about its GPU buffer in the handshake.
    report = ab_test(run_once, local, _memory(remote_mem, pair.gpu, gpu_mem_type),
                     staged=staged, repeats=repeats, threshold=threshold,
                     doctor_findings=(facts.findings if local.kind == "gpu" or host is None
                                      else ()),
                     min_repeats=min(2, repeats))
    return dataclasses.replace(report, placement=dataclasses.replace(
        pair, time_budget_s=time_budget_s, elapsed_s=round(budget.elapsed(), 3)))


def bench(*, sizes=None, memory=("host", "dmabuf", "peermem", "staged"), qps=(1,),
          matrix: bool = False, gpus=(), devices=(), ib_port: int = 1,
          gid_index: int | None = None, iterations: int = 1000, duration_s: float | None = None,
          warmup_s: float = 0.5, tx_depth: int = 128, cq_moderation: int = 100,
          latency_iterations: int = 1000, threshold: float = 0.9, timeout_s: float = 30.0,
          on_row=None):
    """The microbenchmark sweep in loopback: message sizes (default 2 B to 8 MiB) x memory
    kinds x QP counts x GPU-NIC pairs (each GPU with the NIC NCCL gives it; matrix=True:
    every GPU with every NIC), plus host-memory latency per NIC (latency_iterations=0: none).
    A kind that cannot run here becomes rows with its outcome. on_row(row, rows_done,
    rows_planned) sees each :class:`gdrprobe.report.model.BenchRow` as it is measured;
    Ctrl-C ends the sweep with the rows so far (``report.interrupted``). Returns a
    :class:`gdrprobe.report.model.BenchReport`."""
    from gdrprobe.campaign.bench import run_bench
    from gdrprobe.measure.options import SWEEP_SIZES
    from gdrprobe.report.model import BenchSettings

    settings = BenchSettings(
        sizes_bytes=_as_tuple(sizes or SWEEP_SIZES), memory_kinds=_as_tuple(memory),
        qps=_as_tuple(qps), matrix=matrix, iterations=iterations, duration_s=duration_s,
        warmup_s=warmup_s, tx_depth=tx_depth, cq_moderation=cq_moderation,
        latency_iterations=latency_iterations, threshold=threshold, ib_port=ib_port)
    return run_bench(settings, _machine_facts(), gpus=_as_tuple(gpus),
                     devices=_as_tuple(devices), gid_index=gid_index, timeout_s=timeout_s,
                     on_row=on_row or (lambda row, done, total: None))


def _as_tuple(value) -> tuple:
    """One value or several: bench(memory="host") as bench(memory=("host",))."""
    return (value,) if isinstance(value, (str, int)) else tuple(value)


def _machine_facts(root: str = "/", environ=None):
    """The doctor's findings and the facts the choice of GPU and NIC rests on, read once:
    a :class:`gdrprobe.campaign.gate.MachineFacts` (root and environ: a captured machine)."""
    from gdrprobe.doctor.context import DoctorContext
    from gdrprobe.doctor.runner import run_checks
    from gdrprobe.doctor.stack import driver_version_line
    from gdrprobe.campaign.gate import GpuFacts, MachineFacts
    from gdrprobe.sysroot import SysRoot

    ctx = DoctorContext(SysRoot(root), environ)
    findings = run_checks(ctx)
    gpus = GpuFacts.from_doctor(ctx.cuda_facts, [gpu.bdf for gpu in ctx.topology.gpus])
    return MachineFacts(gpus, _nccl_nics(ctx), ctx.cuda_facts, driver_version_line(ctx.root),
                        findings)


def _nccl_nics(ctx) -> dict:
    """GPU bus id -> the NIC NCCL will use for it and why, as the doctor decides it by NCCL's
    rules (NCCL_IB_HCA honoured): :func:`gdrprobe.doctor.nccl_decision.decide`."""
    from gdrprobe.campaign.gate import NicChoice

    return {decision.gpu_bdf: NicChoice(decision.nic, "NCCL's choice: " + decision.why[0])
            for decision in ctx.nccl_decisions if decision.nic is not None}


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


def serve(token: str, *, bind: str = "0.0.0.0", port: int | None = None,
          device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
          runs: int | None = None, timeout_s: float = 30.0) -> None:
    """Serve probe runs to clients that know token (forever, or `runs` runs)."""
    from gdrprobe.doctor.runner import run_doctor
    from gdrprobe.rdma.endpoint import EndpointOptions
    from gdrprobe.measure.session import DEFAULT_PORT, ProbeServer

    endpoint = EndpointOptions(device=device, port=ib_port, gid_index=gid_index)
    # A client whose GPU arm uses this host's GPU buffer gets this host's findings.
    ProbeServer(token, endpoint, bind=bind, port=DEFAULT_PORT if port is None else port,
                timeout_s=timeout_s, findings=run_doctor().findings).serve(runs)


def cluster(*, pattern: str = "all", mem: str = "gpu", gpu: str = "0",
            gpu_mem_type: str = "device", device: str | None = None, ib_port: int = 1,
            gid_index: int | None = None, size: int = 1 << 20, iterations: int = 1000,
            repeats: int = 3, threshold: float = 0.9, slow_fraction: float = 0.8,
            timeout_s: float = 30.0, oob_address: str | None = None):
    """Every pair of nodes of the MPI job this process is a rank of (one rank per node):
    call it on every rank. Rank 0 gets the :class:`gdrprobe.report.model.ClusterReport`,
    the other ranks None."""
    from gdrprobe.doctor.runner import run_doctor
    from gdrprobe.campaign import cluster as _cluster
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.rdma.endpoint import EndpointOptions

    endpoint = EndpointOptions(device=device, port=ib_port, gid_index=gid_index)
    local = _memory(mem, gpu, gpu_mem_type)
    options = ProbeOptions(sizes=(size,), iterations=iterations, timeout_s=timeout_s)
    findings = run_doctor().findings if local.kind == "gpu" else ()
    return _cluster.run_cluster(
        _cluster.world(), pattern, _cluster.pair_server(endpoint, timeout_s),
        lambda: _cluster.advertised_address(endpoint, oob_address),
        _cluster.pair_probe(options, endpoint, local, repeats, threshold, findings),
        slow_fraction)


def doctor(root: str = "/"):
    """Every prerequisite check: a :class:`gdrprobe.report.model.DoctorReport`."""
    from gdrprobe.doctor.runner import run_doctor

    return run_doctor(root)


def capture(dest: str, root: str = "/") -> list[str]:
    """Copy the files the doctor reads into dest; returns the paths copied."""
    from gdrprobe.doctor.capture import capture as _capture

    return _capture(dest, root=root)


def read_nccl_log(path: str):
    """What an NCCL_DEBUG=INFO log proves: a :class:`gdrprobe.nccl.log.NcclLogReport`."""
    from gdrprobe.nccl.log import read_nccl_log as _read_nccl_log

    return _read_nccl_log(path)
