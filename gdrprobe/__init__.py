"""gdrprobe: prove, in-process, whether GPUDirect RDMA is engaged.

Importing the package is cheap: pyverbs and CUDA are loaded only by the
layers that need them, when they are first used. The functions below are the Python
face of the command line; each returns the same report objects the CLI prints.
"""

from __future__ import annotations

from gdrprobe.errors import ExitCode, GdrprobeError

__version__ = "0.1.0"

__all__ = ["ExitCode", "GdrprobeError", "__version__", "list_devices", "run", "serve",
           "check", "require", "doctor", "capture", "read_nccl_log"]


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
                  port or DEFAULT_PORT, token)


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
    this process). settings are :class:`gdrprobe.measure.session.ProbeOptions` fields (mode, sizes,
    iterations, duration_s, qps, tx_depth, cq_moderation, post_list, mtu, timeout_s);
    mem and remote_mem are host, gpu, dmabuf, peermem or staged.
    Returns a :class:`gdrprobe.report.model.RunReport`; raises :class:`GdrprobeError`."""
    probe = _runner(host, token, loopback, port, device, ib_port, gid_index, settings)
    return probe(_memory(mem, gpu, gpu_mem_type), _memory(remote_mem, gpu, gpu_mem_type))


def check(host: str | None = None, *, token: str | None = None, port: int | None = None,
          device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
          mem: str = "gpu", remote_mem: str | None = None, gpu: str = "0",
          gpu_mem_type: str = "device", staged: bool = False, repeats: int = 3,
          threshold: float = 0.9, time_budget_s: float | None = None, **settings):
    """The A/B and its verdict: the host arm against the GPU arm, `repeats` times, on the
    local NIC in loopback (or against host). With time_budget_s each run is a fixed-duration
    run sized so the whole check fits in about that time. Returns a
    :class:`gdrprobe.report.model.CheckReport`; its ``verdict.classification`` is engaged,
    degraded, not engaged or not testable."""
    from gdrprobe.doctor.runner import run_doctor
    from gdrprobe.measure.ab import ab_test
    from gdrprobe.errors import UsageError

    if settings.get("mode", "bandwidth") != "bandwidth":
        raise UsageError("check() compares bandwidth; latency runs use host memory", "")
    settings.setdefault("sizes", (1 << 20,))
    if time_budget_s is not None:
        runs = repeats * (3 if staged else 2)
        # Half the budget measures; the rest is setup, warm-up and the doctor.
        settings.setdefault("duration_s", max(0.1, time_budget_s / 2 / runs))
        settings.setdefault("warmup_s", min(0.5, settings["duration_s"] / 4))
    probe = _runner(host, token, host is None, port, device, ib_port, gid_index, settings)
    local = _memory(mem, gpu, gpu_mem_type)
    # The doctor can speak for this host's GPU only.
    findings = run_doctor().findings if local.kind == "gpu" else ()
    return ab_test(probe, local, _memory(remote_mem, gpu, gpu_mem_type), staged=staged,
                   repeats=repeats, threshold=threshold, doctor_findings=findings)


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
    from gdrprobe.rdma.endpoint import EndpointOptions
    from gdrprobe.measure.session import DEFAULT_PORT, ProbeServer

    endpoint = EndpointOptions(device=device, port=ib_port, gid_index=gid_index)
    ProbeServer(token, endpoint, bind=bind, port=port or DEFAULT_PORT,
                timeout_s=timeout_s).serve(runs)


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
