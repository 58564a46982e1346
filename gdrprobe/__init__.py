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
from gdrprobe.campaign.arguments import (check_gpus, check_host, check_latency_a_b, check_threshold_given,
                                         check_verdict, percent_habit)
from gdrprobe.errors import ExitCode, GdrprobeError, NotTestable, UsageError

__version__ = "0.1.0"

__all__ = ["ExitCode", "GdrprobeError", "__version__", "list_devices", "run", "serve",
           "server", "check", "check_node", "require", "bench", "cluster", "diagnose", "capture",
           "read_nccl_log", "new_token", "token_warning", "TOKEN_ENV", "limits"]

TOKEN_ENV = "GDRPROBE_TOKEN"   # where the command line looks for a token it was not given
FLUSH_ASKED = "asked for (run --flush)"   # what asked run() for NCCL's flush


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
    _check_nccl(nccl, root)
    return run_doctor(root, nccl=nccl)


def _check_nccl(nccl: str | None, root: str) -> None:
    """--nccl names something that is there (under root, for a capture): a typo would
    otherwise be searched past in silence, and the doctor would judge another libnccl."""
    from gdrprobe.sysroot import SysRoot

    if nccl is not None and not SysRoot(root).exists(os.path.abspath(nccl)):
        under = "" if os.path.abspath(root) == "/" else f" under the root {root}"
        raise UsageError(f"--nccl {nccl}: no such file or directory{under}",
                         "name the job's libnccl.so.2, its Python interpreter or its virtual "
                         "environment (e.g. --nccl /opt/venv); a capture keeps the --nccl it "
                         "was taken with: leave it out to replay that")


def capture(dest: str, root: str = "/", replace: bool = False, nccl: str | None = None) -> list[str]:
    """Copy the files the doctor reads into dest, a new or empty directory (replace=True:
    or an earlier capture, replaced once the new one is complete; nothing is ever merged);
    returns the paths copied. ``nccl``: as for :func:`diagnose`, kept for the replay."""
    from gdrprobe.doctor.capture import capture as _capture

    _check_nccl(nccl, root)
    return _capture(dest, root=root, replace=replace, nccl=nccl)


def read_nccl_log(path: str, lines: bool = False):
    """What an NCCL_DEBUG=INFO log proves: a :class:`gdrprobe.report.nccl_log.NcclLogReport`
    (its ``exit_code`` is 1 when network channels ran and none used GPUDirect RDMA, or GDR
    was off on every NIC; 9 when its network lines could not be read). The file is streamed;
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


def _check_token(token: str | None, required: bool) -> None:
    from gdrprobe.protocol.token import TOKEN_FIX

    if required and not token:
        raise UsageError("no token: the server only talks to clients that know its token",
                         f"pass --token TOKEN (printed by 'gdrprobe serve') or set {TOKEN_ENV}")
    problem = None if token is None else token_warning(token)
    if problem:
        raise UsageError(problem, TOKEN_FIX)


# ---- the pieces every run is made of ------------------------------------------------------


def _endpoint(device: str | None, ib_port: int, gid_index: int | None):
    from gdrprobe.rdma.endpoint import EndpointOptions

    if not 1 <= ib_port <= 255:
        raise UsageError(f"--ib-port {ib_port} is not a port number", "use 1 or 2")
    return EndpointOptions(device=device, port=ib_port, gid_index=gid_index)


def _memory(choice: str, gpu: str = "0", gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
            pcie_mapping: bool = False, huge_pages: bool = False,
            gpu_alloc: str = defaults.GPU_ALLOCATION):
    """A buffer's spec; gpu_alloc: device memory through VMM as NCCL allocates it ("vmm",
    cuMemAlloc where VMM is unsupported) or cuMemAlloc ("malloc")."""
    from gdrprobe.memory.spec import MemorySpec

    return MemorySpec.from_choice(choice, gpu=gpu, memory_type=gpu_mem_type,
                                  pcie_mapping=pcie_mapping, huge_pages=huge_pages,
                                  allocation=gpu_alloc)


def _options(a_b: bool, size: int | None, settings: dict, nccl_view):
    """A run's options: the A/B compares bandwidth at large messages (A_B_SIZE) unless a
    size is given; registration follows NCCL_IB_PCI_RELAXED_ORDERING as the job's NCCL
    reads it (nccl_view: the environment as NCCL sees it, configuration files included, and
    its release's rules) unless relaxed_ordering is given; the rest is ProbeOptions' own
    (gdrprobe.defaults)."""
    from gdrprobe.measure.options import ProbeOptions

    settings = {key: value for key, value in settings.items() if value is not None}
    if "sizes" not in settings:
        default = defaults.A_B_SIZE if a_b else defaults.SIZE
        settings["sizes"] = (default if size is None else size,)
    if "relaxed_ordering" not in settings:
        environ, rules = nccl_view
        settings["relaxed_ordering"] = rules.relaxed_ordering(environ)
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
        gpu_alloc: str = defaults.GPU_ALLOCATION, flush: bool = False, **settings):
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
    Raises :class:`GdrprobeError`."""
    from gdrprobe.campaign.ab import ab_test
    from gdrprobe.campaign.latency_ab import latency_ab
    from gdrprobe.campaign.machine import follow_nccl, nccl_view, run_facts
    from gdrprobe.campaign.memlock import fit_to_memlock, locked_memory
    from gdrprobe.measure.loopback import runner

    if bool(host) == bool(loopback):
        raise UsageError("give either a server host or loopback", "e.g. 'gdrprobe run "
                         "10.0.0.2 --token TOKEN' or 'gdrprobe run --loopback'")
    check_host(host)
    check_verdict(threshold, repeats)
    check_gpus(gpu)
    _check_token(None if loopback else token, required=not loopback)
    if not 0 <= connect_wait_s <= 3600:
        raise UsageError("--connect-wait must be 0 to 3600 s",
                         "e.g. --connect-wait 60 for a server that is still starting")
    local = _memory(mem, gpu, gpu_mem_type, pcie_mapping, huge_pages, gpu_alloc)
    remote = _memory(remote_mem, gpu, gpu_mem_type, pcie_mapping, huge_pages, gpu_alloc) \
        if remote_mem else None
    a_b = local.kind == "gpu" or (remote is not None and remote.kind == "gpu")
    latency_a_b = a_b and settings.get("mode") == "latency"
    if latency_a_b:   # which end the CPU checks, before a GPU runtime is looked for
        check_latency_a_b(settings.get("opcode", "write"), local, remote)
    if a_b:
        _require_gpu_arm(local, remote if loopback else None)
    if flush:
        settings["flush"] = FLUSH_ASKED
    # This host's facts where a GPU buffer is here: --mem gpu registers as NCCL does.
    facts = run_facts(local, loopback) if a_b else None
    local = follow_nccl(local, facts)
    remote = follow_nccl(remote, facts) if loopback and remote is not None else remote
    view = (facts.nccl_environ, facts.nccl_rules) if facts else nccl_view()
    # Both ends pin their buffers here in loopback, the client's alone against a server.
    # The bandwidth A/B's default size is a large message's; latency keeps a run's default.
    options = fit_to_memlock(_options(a_b and not latency_a_b, size, settings, view),
                             2 if loopback else 1,
                             locked_memory(), notice)
    probe = runner(options, _endpoint(device, ib_port, gid_index),
                   None if loopback else host, _port(port), token, connect_wait_s,
                   on_result=None if a_b else on_result, notice=notice)
    if not a_b:
        return probe(local, remote)
    if latency_a_b:
        return latency_ab(probe, local, remote, repeats)
    return ab_test(probe, local, remote, staged=staged, repeats=repeats,
                   threshold=threshold, doctor_findings=facts.findings if facts else (),
                   opcode=options.opcode)


def _require_gpu_arm(*in_process) -> None:
    """What the A/B needs before its host arm measures anything, so that a machine that
    cannot run the GPU arm answers "not testable" at once with the cause: an RDMA device,
    then, for a GPU buffer in this process, the node's GPU runtime library (found as the
    runtime finds it, without importing its bindings: memory.runtime)."""
    from gdrprobe.campaign.ab import no_device_not_testable
    from gdrprobe.errors import NoRdmaDevice
    from gdrprobe.memory.runtime import require_gpu_library
    from gdrprobe.rdma.verbs import devices

    try:
        devices()
    except NoRdmaDevice as error:
        raise no_device_not_testable(error) from error
    if any(spec is not None and spec.kind == "gpu" for spec in in_process):
        require_gpu_library()


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
    from gdrprobe.measure.server import ProbeServer

    _check_token(token, required=True)
    check_gpus(gpu)
    return ProbeServer(token, _endpoint(device, ib_port, gid_index), bind=bind,
                       port=_port(port), timeout_s=timeout_s, max_buffer=max_buffer,
                       memory=_memory(mem, gpu, gpu_mem_type, pcie_mapping, huge_pages,
                                      gpu_alloc),
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


def _gate(time_budget_s, settings: dict, *, ib_port, gid_index, mem, gpu_mem_type,
          gpu_alloc, staged, repeats, threshold, floor, size, host=None, token=None,
          port=None, remote_mem=None, job=None, latency=False, read=False, bidir=False,
          latency_factor=None):
    """What check() and check_node() share: the budget, started first (it limits the whole
    call); what can be refused before the doctor runs; the machine read once (one doctor,
    one CUDA start-up), and GpuUnusable (exit 11) where the GPU runtime lost GPUs sysfs lists; and
    what every check of the call is asked
    (campaign.prelaunch.GateSettings): the runs' options with check's QPs (CHECK_QPS) and
    NCCL's relaxed-ordering setting from the environment as NCCL sees it; the send buffer
    as mem says, the receive buffer the same (loopback: GPU memory at both ends) unless
    remote_mem says otherwise; the GPU memory allocated as NCCL will allocate it
    (NCCL_CUMEM_ENABLE) unless gpu_alloc says; the extra answers asked for (latency, read, bidir;
    latency_factor None: the default). Returns (budget, facts, gate)."""
    from gdrprobe.campaign.gate import Budget
    from gdrprobe.campaign.machine import machine_facts, require_gpus
    from gdrprobe.campaign.prelaunch import GateSettings, check_floor
    from gdrprobe.campaign.secondary import check_latency_factor

    budget = Budget(time_budget_s)
    if latency_factor is not None:
        check_latency_factor(latency_factor, latency)
    if settings.get("mode", "bandwidth") != "bandwidth":
        raise UsageError("check() compares bandwidth; latency runs use host memory",
                         "drop mode='latency' (latency: run() with host memory)")
    _endpoint(None, ib_port, None)
    check_verdict(threshold, repeats)
    percent_habit("--floor", floor)
    check_floor(floor)
    if host is not None:
        check_host(host)
        _check_token(token, required=True)
    facts = machine_facts(job=job)    # job: the job's GPUs, NCCL's communicator on this node
    require_gpus(facts)           # GPUs lost to the GPU runtime: every job here meets it (exit 11)
    gpu_alloc = gpu_alloc or facts.nccl_rules.gpu_allocation(facts.nccl_environ)
    settings = {key: value for key, value in settings.items() if value is not None}
    settings.setdefault("qps", defaults.CHECK_QPS)

    def send(gpu: str):
        return _memory(mem, gpu, gpu_mem_type, gpu_alloc=gpu_alloc)

    def receive(gpu: str):
        choice = remote_mem or (mem if host is None else "host")
        return _memory(choice, gpu, gpu_mem_type, gpu_alloc=gpu_alloc)

    return budget, facts, GateSettings(
        options=_options(True, size, settings, (facts.nccl_environ, facts.nccl_rules)),
        gpu_memory=send, receive_memory=receive,
        ib_port=ib_port, gid_index=gid_index, repeats=repeats, threshold=threshold,
        floor=floor, staged=staged, keep_cq_moderation="cq_moderation" in settings,
        host=host, port=_port(port), token=token, latency=latency, read=read, bidir=bidir,
        **_latency_bound(latency_factor))


def _latency_bound(factor: float | None) -> dict:
    """The latency bound's GateSettings fields: as given, or the default's."""
    if factor is None:
        return {}
    return {"latency_factor": factor,
            "latency_factor_source": f"as given (latency_factor={factor:g})"}


def check(host: str | None = None, *, token: str | None = None, port: int | None = None,
          device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
          mem: str = defaults.GPU_MEMORY, remote_mem: str | None = None, gpu: str | None = None,
          gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
          gpu_alloc: str | None = None, staged: bool = False,
          repeats: int = defaults.REPEATS, threshold: float = defaults.THRESHOLD,
          floor: float = defaults.FLOOR,
          time_budget_s: float | None = defaults.CHECK_TIME_BUDGET_S, size: int | None = None,
          latency: bool = False, read: bool = False, bidir: bool = False,
          latency_factor: float | None = None, **settings):
    """The A/B and its verdict as NCCL will move this GPU's bytes: GPU memory at both ends
    on the local NIC in loopback (the NIC reads one GPU buffer and writes another; where
    that falls short, one arm per direction names the one that fails), or against host.
    Without gpu and device, the pair this process's rank will use: the GPU from LOCAL_RANK
    (torchrun), SLURM_LOCALID (srun) or OMPI_COMM_WORLD_LOCAL_RANK among the GPUs
    CUDA_VISIBLE_DEVICES leaves, the NIC NCCL will use for it, and with PXN the NVLink
    peer's memory for the sends; ``report.placement`` says which and why. With mem="gpu"
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
    host memory's by more than latency_factor, default LATENCY_FACTOR) and read=True the A/B
    with RDMA READ (``report.read``: "GDR read degraded", NCCL_NET_GDR_READ=0 named), bidir=True
    the A/B with both ends WRITEing at once (``report.bidir``, the same answer); each
    shortfall is a warning in ``verdict.warnings`` (exit 13), never a drain. NCCL's flush,
    where it ran, is ``report.flush``. Returns a :class:`gdrprobe.report.model.CheckReport`."""
    import dataclasses

    from gdrprobe.campaign.gate import rank_pair
    from gdrprobe.campaign.memlock import fit_to_memlock, locked_memory
    from gdrprobe.campaign.prelaunch import check_pair

    check_gpus(gpu)
    budget, facts, gate = _gate(
        time_budget_s, settings, host=host, token=token, port=port, ib_port=ib_port,
        gid_index=gid_index, mem=mem, remote_mem=remote_mem, gpu_mem_type=gpu_mem_type,
        gpu_alloc=gpu_alloc, staged=staged, repeats=repeats, threshold=threshold,
        floor=floor, size=size, latency=latency, read=read, bidir=bidir,
        latency_factor=latency_factor)
    pair = rank_pair(os.environ, facts.gpus, facts.nics, gpu, device)
    # Both ends pin their host buffers here in loopback (check_node fits its NICs itself).
    gate = dataclasses.replace(gate, options=fit_to_memlock(
        gate.options, 1 if host else 2, locked_memory()))
    try:
        return check_pair(pair, facts, gate, budget, os.environ)
    except NotTestable as error:
        return _not_testable_check(error, pair, threshold, budget)


def _not_testable_check(error: GdrprobeError, pair, threshold: float, budget):
    """A check that could not start a single run (no RDMA device at all, the NIC another
    check held past the budget) answers as every other "not testable" does: the report,
    exit 9, not an exception (README's answers, docs/api.md); require() raises from it."""
    import dataclasses

    from gdrprobe.report.check import NOT_TESTABLE, CheckReport, Verdict

    verdict = Verdict(NOT_TESTABLE, threshold=threshold, likely_causes=(error.cause,),
                      fix=error.fix, evidence=(error.evidence,) if error.evidence else ())
    placement = dataclasses.replace(pair, time_budget_s=budget.seconds,
                                    elapsed_s=round(budget.elapsed(), 3))
    return CheckReport(verdict, arms=(), settings=None, repeats=0, placement=placement)


def check_node(*, gpus: str | None = None, ib_port: int = 1, gid_index: int | None = None,
               mem: str = defaults.GPU_MEMORY, gpu_mem_type: str = defaults.GPU_MEMORY_TYPE,
               gpu_alloc: str | None = None, staged: bool = False,
               repeats: int = defaults.REPEATS,
               threshold: float = defaults.THRESHOLD, floor: float = defaults.FLOOR,
               time_budget_s: float | None = defaults.CHECK_TIME_BUDGET_S,
               size: int | None = None, all_rails: bool = False, latency: bool = False,
               read: bool = False, bidir: bool = False, latency_factor: float | None = None,
               **settings):
    """:func:`check` for every GPU of the job with the NIC NCCL will use for it, in one
    process (one doctor, one CUDA start-up): GPUs sharing a NIC one after the other, NICs in
    parallel as far as the locked-memory limit holds them (``report.memlock`` says how it
    fitted them), all inside time_budget_s; latency, read, bidir and latency_factor as in
    check().
    The job's GPUs: gpus (comma-separated CUDA
    ordinals, bus ids or UUIDs), else SLURM_STEP_GPUS, SLURM_JOB_GPUS,
    NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, the first set; else every GPU of the
    node (:mod:`gdrprobe.campaign.job_gpus`). Returns a
    :class:`gdrprobe.report.model.NodeCheckReport`: one entry per GPU, and ``exit_code``
    the worst of theirs (a drain before a warn). all_rails (on an idle node): the NICs one
    at a time, then every rail at once (:mod:`gdrprobe.campaign.rails`); ``report.rails``
    holds each rail solo, together and their ratio, the aggregate and the verdict
    ("contention": exit 13, a warning; rails that did not run together: 12)."""
    from gdrprobe.campaign.job_gpus import job_gpus
    from gdrprobe.campaign.node import check_node as _check_node

    job = job_gpus(os.environ, gpus)      # a malformed list is refused before the doctor
    budget, facts, gate = _gate(
        time_budget_s, settings, ib_port=ib_port, gid_index=gid_index, mem=mem,
        gpu_mem_type=gpu_mem_type, gpu_alloc=gpu_alloc, staged=staged, repeats=repeats,
        threshold=threshold, floor=floor, size=size, job=job, latency=latency, read=read,
        bidir=bidir, latency_factor=latency_factor)
    return _check_node(facts, gate, budget, os.environ, job=job, every_rail=all_rails)


def require(**kwargs):
    """:func:`check`, raising unless GPUDirect RDMA is engaged: a prelaunch gate for a
    training job. Returns the report when engaged (exit 0, or 13: engaged with a warning
    from latency=True or read=True, never a reason to stop the job); raises VerdictNotOk (exit 1:
    degraded, not engaged, or NCCL's rules refuse it on this node), NcclSetting (10: an NCCL
    setting keeps NCCL off it), NotTestable (9) or Inconclusive (12: the measurement could
    not tell, however its median leaned)."""
    from gdrprobe.errors import Inconclusive, NcclSetting, NotTestable, VerdictNotOk
    from gdrprobe.report.check import main_cause

    report = check(**kwargs)
    verdict = report.verdict
    if verdict.exit_code in (ExitCode.OK, ExitCode.PERFORMANCE_WARNING):
        return report
    error = {int(ExitCode.NOT_TESTABLE): NotTestable,
             int(ExitCode.NCCL_SETTING): NcclSetting,
             int(ExitCode.INCONCLUSIVE): Inconclusive}.get(verdict.exit_code, VerdictNotOk)
    ratio = f" (GPU/host {verdict.ratio:.2f})" if verdict.ratio is not None else ""
    cause = f": {main_cause(verdict)}" if verdict.likely_causes or verdict.inconclusive else ""
    state = verdict.classification + (", inconclusive" if error is Inconclusive else "")
    raise error(f"GPUDirect RDMA is {state}{ratio}{cause}",
                verdict.fix, evidence="; ".join(verdict.evidence))


# ---- the benchmark sweep and the cluster matrix -------------------------------------------


def bench(*, sizes=None, memory=defaults.BENCH_MEMORY, qps=(defaults.QPS,),
          matrix: bool = False, gpus=(), devices=(), ib_port: int = 1,
          gid_index: int | None = None, iterations: int = defaults.ITERATIONS,
          duration_s: float | None = None, warmup_s: float = defaults.WARMUP_S,
          tx_depth: int = defaults.TX_DEPTH, cq_moderation: int = defaults.CQ_MODERATION,
          latency_iterations: int = defaults.LATENCY_ITERATIONS,
          threshold: float = defaults.THRESHOLD, timeout_s: float = defaults.TIMEOUT_S,
          baseline: str | None = None, max_drop: float = defaults.MAX_DROP, on_row=None,
          opcode: str = "write", bidir: bool = False, all_rails: bool = False):
    """The microbenchmark sweep in loopback: message sizes (default 2 B to 8 MiB) x memory
    kinds x QP counts x GPU-NIC pairs (each GPU with the NIC NCCL gives it; matrix=True:
    every GPU with every NIC), plus host-memory latency per NIC (latency_iterations=0: none).
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
    Returns a :class:`gdrprobe.report.model.BenchReport`; its ``exit_code`` is 1 when a row
    fell, else with all_rails the rails' (13 contention, 12 inconclusive)."""
    import dataclasses

    from gdrprobe.campaign.bench import check_max_drop, compare_rows, run_bench
    from gdrprobe.campaign.machine import machine_facts
    from gdrprobe.report.bench import read_baseline
    from gdrprobe.report.model import BenchSettings

    check_threshold_given(threshold)
    percent_habit("--max-drop", max_drop)
    check_gpus(*_as_tuple(gpus))
    before = read_baseline(baseline) if baseline else None
    check_max_drop(max_drop)
    settings = BenchSettings(
        sizes_bytes=_as_tuple(sizes or defaults.SWEEP_SIZES), memory_kinds=_as_tuple(memory),
        qps=_as_tuple(qps), matrix=matrix, iterations=iterations, duration_s=duration_s,
        warmup_s=warmup_s, tx_depth=tx_depth, cq_moderation=cq_moderation,
        latency_iterations=latency_iterations, threshold=threshold, ib_port=ib_port,
        opcode=opcode, bidir=bidir, all_rails=all_rails)
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
            timeout_s: float = defaults.TIMEOUT_S, oob_address: str | None = None,
            gpu_alloc: str = defaults.GPU_ALLOCATION, bidir: bool = False):
    """Every pair of nodes of the MPI job this process is a rank of (one rank per node):
    call it on every rank. Rank 0 gets the :class:`gdrprobe.report.model.ClusterReport`
    (its ``exit_code`` is the worst pair's; a slow pair alone: 1), the other ranks None.
    bidir=True: both ranks of a pair WRITE at once in one window (perftest's -b); each
    pair's ``bidirectional`` has per arm each direction and the sum."""
    from gdrprobe.campaign import cluster as _cluster
    from gdrprobe.campaign.machine import follow_nccl, nccl_view, run_facts

    percent_habit("--slow-fraction", slow_fraction)
    if not 0 < slow_fraction <= 1:
        raise UsageError(f"--slow-fraction {slow_fraction}: use a fraction over 0 and at "
                         "most 1", f"e.g. {defaults.SLOW_FRACTION}")
    check_verdict(threshold, repeats)
    check_gpus(gpu)
    endpoint = _endpoint(device, ib_port, gid_index)
    local = _memory(mem, gpu, gpu_mem_type, pcie_mapping, huge_pages, gpu_alloc)
    facts = run_facts(local, loopback=False)
    view = (facts.nccl_environ, facts.nccl_rules) if facts else nccl_view()
    options = _options(True, size, {"iterations": iterations, "timeout_s": timeout_s,
                                    "bidir": bidir}, view)
    return _cluster.run_cluster(
        _cluster.world(), pattern, _cluster.pair_server(endpoint, timeout_s),
        lambda: _cluster.advertised_address(endpoint, oob_address),
        _cluster.pair_probe(options, endpoint, follow_nccl(local, facts), repeats, threshold,
                            facts.findings if facts else ()),
        slow_fraction)
