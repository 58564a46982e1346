"""gdrprobe: prove, in-process, whether GPUDirect RDMA is engaged.

Importing the package is cheap: pyverbs, CUDA and numpy are loaded only by the
layers that need them, when they are first used. The functions below are the Python
face of the command line; each returns the same report objects the CLI prints.
"""

from __future__ import annotations

from gdrprobe.errors import ExitCode, GdrprobeError

__version__ = "0.1.0"

__all__ = ["ExitCode", "GdrprobeError", "__version__", "list_devices", "run", "serve",
           "doctor", "capture", "read_nccl_log"]


def list_devices(device: str | None = None):
    """Inventory of the RDMA devices: a :class:`gdrprobe.report.DeviceReport`."""
    from gdrprobe.devices import list_devices as _list_devices

    return _list_devices(device)


def run(host: str | None = None, *, token: str | None = None, loopback: bool = False,
        port: int | None = None, device: str | None = None, ib_port: int = 1,
        gid_index: int | None = None, **settings):
    """One probe against ``gdrprobe serve`` on host (or, with loopback=True, both ends in
    this process). settings are :class:`gdrprobe.probe.ProbeOptions` fields (mode, sizes,
    iterations, duration_s, qps, tx_depth, cq_moderation, post_list, mtu, timeout_s).
    Returns a :class:`gdrprobe.report.RunReport`; raises :class:`GdrprobeError`."""
    from gdrprobe.endpoint import EndpointOptions
    from gdrprobe.errors import UsageError
    from gdrprobe.probe import DEFAULT_PORT, ProbeClient, ProbeOptions, run_loopback

    options = ProbeOptions(**settings)
    endpoint = EndpointOptions(device=device, port=ib_port, gid_index=gid_index)
    if loopback:
        return run_loopback(options, endpoint)
    if not host or not token:
        raise UsageError("run() needs a host and the server's token (or loopback=True)")
    return ProbeClient(host, port or DEFAULT_PORT, token, options, endpoint).run()


def serve(token: str, *, bind: str = "0.0.0.0", port: int | None = None,
          device: str | None = None, ib_port: int = 1, gid_index: int | None = None,
          runs: int | None = None, timeout_s: float = 30.0) -> None:
    """Serve probe runs to clients that know token (forever, or `runs` runs)."""
    from gdrprobe.endpoint import EndpointOptions
    from gdrprobe.probe import DEFAULT_PORT, ProbeServer

    endpoint = EndpointOptions(device=device, port=ib_port, gid_index=gid_index)
    ProbeServer(token, endpoint, bind=bind, port=port or DEFAULT_PORT,
                timeout_s=timeout_s).serve(runs)


def doctor(root: str = "/"):
    """Every prerequisite check: a :class:`gdrprobe.report.DoctorReport`."""
    from gdrprobe.doctor.runner import run_doctor

    return run_doctor(root)


def capture(dest: str, root: str = "/") -> list[str]:
    """Copy the files the doctor reads into dest; returns the paths copied."""
    from gdrprobe.doctor.capture import capture as _capture

    return _capture(dest, root=root)


def read_nccl_log(path: str):
    """What an NCCL_DEBUG=INFO log proves: a :class:`gdrprobe.nccl_log.NcclLogReport`."""
    from gdrprobe.commands.nccl_log import read_bounded
    from gdrprobe.nccl_log import parse_nccl_log

    text, truncated = read_bounded(path)
    return parse_nccl_log(text, source=path, truncated=truncated)
