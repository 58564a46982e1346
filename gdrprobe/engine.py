"""Drive the C loops: in a worker thread, so Ctrl-C and deadlines stay responsive while
the loop runs without the GIL, and turn what the loop returns into results or errors."""

from __future__ import annotations

import threading
import time

from gdrprobe import _native
from gdrprobe.errors import Interrupted, PeerError, RdmaError
from gdrprobe.report import BandwidthResult, Integrity, LatencyResult

STALL_TIMEOUT_S = 10.0
WC_RETRY_EXCEEDED = 12
WC_REMOTE_ACCESS_ERROR = 10


def run_interruptibly(loop, *args, stop: _native.StopFlag, tick=None, tick_every_s=2.0):
    """Run loop(*args, stop) in a thread; on Ctrl-C set the flag, wait for the loop to
    notice (it polls the flag) and re-raise, so no verbs object is torn down under it.
    tick, if given, is called every tick_every_s while the loop runs (a heartbeat)."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = loop(*args, stop)
        except BaseException as error:   # handed to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, name="gdrprobe-loop", daemon=True)
    worker.start()
    next_tick = time.monotonic() + tick_every_s
    try:
        while worker.is_alive():
            # Waking only for the next heartbeat keeps this thread off the CPUs the loop and
            # the NIC's driver need; a signal still interrupts the wait at once.
            worker.join(max(0.0, next_tick - time.monotonic()) if tick else 0.5)
            if tick is not None and time.monotonic() >= next_tick:
                next_tick += tick_every_s
                tick()
    except BaseException:
        stop.set()
        join_despite_interrupts(worker)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def join_despite_interrupts(worker: threading.Thread) -> None:
    """Wait for the loop to notice the stop flag, even through a second Ctrl-C: the verbs
    objects it uses must not be torn down under it."""
    while worker.is_alive():
        try:
            worker.join()
        except KeyboardInterrupt:
            continue


def check_status(result: dict, what: str) -> None:
    """Raise the error a person can act on for a loop that did not finish."""
    status = result["status"]
    if status == _native.STATUS_OK:
        return
    if status == _native.STATUS_STOPPED:
        raise Interrupted(f"{what} was interrupted", "")
    if status == _native.STATUS_STALL:
        raise PeerError(f"{what} made no progress for {STALL_TIMEOUT_S:g} s",
                        "the peer stopped answering: check that it is still running")
    if status == _native.STATUS_WC:
        name = _native.wc_status_str(result["wc_status"])
        evidence = (f"work completion status {result['wc_status']} ({name}), vendor error "
                    f"0x{result['wc_vendor_err']:x}, QP 0x{result['wc_qp_num']:x}")
        if result["wc_status"] == WC_RETRY_EXCEEDED:
            raise PeerError(f"{what} failed: the peer stopped acknowledging writes",
                            "check that the peer is still running and the link is up",
                            evidence=evidence)
        if result["wc_status"] == WC_REMOTE_ACCESS_ERROR:
            raise RdmaError(f"{what} failed: the peer refused the write (remote access)",
                            "the peer's buffer or key changed; run again", evidence=evidence)
        raise RdmaError(f"{what} failed", "see 'gdrprobe doctor' and dmesg", evidence=evidence)
    detail = _native.STATUS_NAMES.get(status, str(status))
    if result.get("errno"):
        detail += f" (errno {result['errno']})"
    raise RdmaError(f"{what} failed: {detail}", "see 'gdrprobe doctor' and dmesg")


def bandwidth_result(size: int, raw: dict, integrity: Integrity) -> BandwidthResult:
    seconds = raw["elapsed_ns"] / 1e9
    total = raw["messages"] * size
    average = total / seconds if seconds > 0 else 0.0
    peak = max(raw["peak_bytes_per_s"], average)
    return BandwidthResult(
        size_bytes=size,
        iterations=raw["messages"],
        elapsed_s=seconds,
        bandwidth_avg_gbps=average * 8 / 1e9,
        bandwidth_peak_gbps=peak * 8 / 1e9,
        bandwidth_avg_mib_s=average / (1 << 20),
        bandwidth_peak_mib_s=peak / (1 << 20),
        message_rate_mpps=raw["messages"] / seconds / 1e6 if seconds > 0 else 0.0,
        integrity=integrity,
    )


def latency_result(size: int, iterations: int, round_trip: dict,
                   integrity: Integrity) -> LatencyResult:
    one_way = {key: value / 2 / 1000 for key, value in round_trip.items() if key != "samples"}
    return LatencyResult(
        size_bytes=size,
        iterations=iterations,
        latency_us_min=one_way["min_ns"],
        latency_us_median=one_way["median_ns"],
        latency_us_mean=one_way["mean_ns"],
        latency_us_stdev=one_way["stdev_ns"],
        latency_us_p99=one_way["p99_ns"],
        latency_us_p999=one_way["p999_ns"],
        latency_us_max=one_way["max_ns"],
        integrity=integrity,
    )
