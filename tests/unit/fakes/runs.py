"""Recorded runs and the probes that return them: the A/B's seam (run_once) without verbs."""

from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report.model import (BandwidthResult, EndpointSummary, Integrity, RunReport,
                                   RunSettings)

HOST = MemorySpec()
GPU = MemorySpec.from_choice("gpu")
SIZE = 8 << 20
SETTINGS = RunSettings("bandwidth", (SIZE,), 100, 0, None, 0.0, 1, 128, 100, 1, 4096)


def recorded_run(gbps: float, memory: dict) -> RunReport:
    ok = Integrity(True, SIZE, 0, None, 0, None)
    row = BandwidthResult(SIZE, 100, 1.0, gbps, gbps, 0, 0, 0, ok)
    end = EndpointSummary("h", "mlx5_0", 1, 3, "::ffff:10.0.0.1", 4096, (17,), memory)
    remote = EndpointSummary("peer", "mlx5_0", 1, 3, "::ffff:10.0.0.2", 4096, (18,),
                             {"kind": "host"})
    return RunReport(SETTINGS, end, remote, "layout", (row,), ())


def fake_probe(gpu_gbps=None, gpu_error=None, mechanism="dmabuf", host_gbps=100.0):
    """run_once whose host arms measure host_gbps and GPU arms gpu_gbps (or raise
    gpu_error), and the list of the arms it ran."""
    calls = []

    def run_once(local: MemorySpec, remote: MemorySpec) -> RunReport:
        calls.append(local.label)
        if local.kind == "host":
            return recorded_run(host_gbps, {"kind": "host"})
        if gpu_error is not None:
            raise gpu_error
        return recorded_run(gpu_gbps, {"kind": "gpu", "mechanism": mechanism,
                                       "mechanism_reason": "auto: both can"})

    return run_once, calls


def probe_by_mechanism(outcomes: dict, calls: list):
    """run_once whose GPU arms end as outcomes[mechanism] says: a bandwidth, or an error."""
    def run_once(local: MemorySpec, remote: MemorySpec) -> RunReport:
        calls.append(local.mechanism if local.kind == "gpu" else "host")
        if local.kind == "host":
            return recorded_run(100.0, {"kind": "host"})
        outcome = outcomes[local.mechanism]
        if isinstance(outcome, Exception):
            raise outcome
        mechanism = "peermem" if local.mechanism == "auto" else local.mechanism
        return recorded_run(outcome, {"kind": "gpu", "mechanism": mechanism,
                                      "memory_type": local.memory_type})
    return run_once


def run_report(gbps: float) -> RunReport:
    """One 4 KiB run on rxe0 at gbps: a cluster pair's or a bench row's recorded run."""
    integrity = Integrity(True, 4096, 0, None, 0, None)
    row = BandwidthResult(4096, 10, 0.1, gbps, gbps, 1.0, 1.0, 0.1, integrity)
    settings = RunSettings("bandwidth", (4096,), 10, 0, None, 0.0, 1, 10, 10, 1, 1024)
    end = EndpointSummary("h", "rxe0", 1, 1, "::1", 1024, (17,), {"kind": "host"})
    return RunReport(settings, end, end, "layout", (row,), ())
