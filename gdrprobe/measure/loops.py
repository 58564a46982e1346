"""Drive the C loops: in a worker thread, so Ctrl-C and deadlines stay responsive while
the loop runs without the GIL, and turn what the loop returns into results or errors."""

from __future__ import annotations

import threading
import time

from gdrprobe import _native
from gdrprobe.errors import Interrupted, PeerError, RdmaError
from gdrprobe.report.model import BandwidthResult, Integrity, LatencyResult

# The loop calls the peer stalled when no completion arrives for the time the slowest link
# gdrprobe supports needs to drain what is in flight, and never sooner than the floor. Soft-
# RoCE under emulation moves about 10 MiB/s; the rate below leaves it a tenfold margin. A
# dead peer is reported sooner by the channel's heartbeat and the QP's retry-exceeded
# completion.
STALL_FLOOR_S = 10.0
SLOWEST_LINK_BYTES_PER_S = 1 << 20


def stall_timeout_s(in_flight_bytes: int) -> float:
    return max(STALL_FLOOR_S, in_flight_bytes / SLOWEST_LINK_BYTES_PER_S)
WC_RETRY_EXCEEDED = 12
WC_REMOTE_ACCESS_ERROR = 10


class LoopThread:
    """One C loop running in a worker thread with the GIL released, so Ctrl-C, heartbeats and
    the other side of the channel stay responsive; the loop polls ``stop`` to end early."""

    def __init__(self, loop, config, stop: _native.StopFlag):
        self.stop = stop
        self._outcome: dict = {}
        self._thread = threading.Thread(target=self._target, args=(loop, config),
                                        name="gdrprobe-loop", daemon=True)
        self._thread.start()

    def _target(self, loop, config) -> None:
        try:
            self._outcome["value"] = loop(config, self.stop)
        except BaseException as error:   # handed to the caller's thread
            self._outcome["error"] = error

    def wait(self, tick=None, tick_every_s: float = 2.0) -> dict:
        """The loop's result once it ends; tick, if given, is called every tick_every_s
        meanwhile (a heartbeat). On Ctrl-C the loop is stopped before this re-raises, so no
        verbs object is torn down under it."""
        next_tick = time.monotonic() + tick_every_s
        try:
            while self._thread.is_alive():
                # Waking only for the next heartbeat keeps this thread off the CPUs the loop
                # and the NIC's driver need; a signal still interrupts the wait at once.
                self._thread.join(max(0.0, next_tick - time.monotonic()) if tick else 0.5)
                if tick is not None and time.monotonic() >= next_tick:
                    next_tick += tick_every_s
                    tick()
        except BaseException:
            self.finish()
            raise
        return self._result()

    def finish(self) -> dict:
        """Stop the loop if it still runs, wait for it (through further Ctrl-Cs) and return
        its result."""
        if self._thread.is_alive():
            self.stop.set()
        while self._thread.is_alive():
            try:
                self._thread.join()
            except KeyboardInterrupt:
                continue
        return self._result()

    def _result(self) -> dict:
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome.get("value")


def check_status(result: dict, what: str, stall_timeout: float = STALL_FLOOR_S) -> None:
    """Raise the error a person can act on for a loop that did not finish."""
    status = result["status"]
    if status == _native.STATUS_OK:
        return
    if status == _native.STATUS_STOPPED:
        raise Interrupted(f"{what} was interrupted", "")
    if status == _native.STATUS_STALL:
        raise PeerError(f"{what} made no progress for {stall_timeout:g} s",
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
