"""Drive the C loops: in a worker thread, so Ctrl-C and deadlines stay responsive while
the loop runs without the GIL, and turn what the loop returns (the native layer's typed,
immutable BandwidthLoopResult and LatencyLoopResult) into report rows or errors."""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time

from gdrprobe import _native
from gdrprobe.errors import CompletionError, GdrprobeError, Interrupted, PeerError, RdmaError
from gdrprobe.report.model import BandwidthResult, BidirResult, Integrity, LatencyResult

# The watchdog of a loop: how long it may see no completion before it calls the link
# stalled. A signalled completion can wait for everything in flight to cross the wire (with
# -n 20 -Q 20 only the 20th write is signalled, so 20 messages first), so the limit grows
# with the bytes in flight over the port's rate. A port's nominal rate says little about a
# shared, congested or emulated link: Soft-RoCE reports 2.5 Gb/s for a netdev of unknown
# speed (the kernel's ib_get_eth_speed falls back to 1000 Mb/s, SDR 1X) and moved 11-76 MiB/s
# in the lab, 4 to 27 times less; SLOW_LINK_FACTOR allows 100. The floor covers what does
# not scale with bytes (the first completion, a scheduler's pause). A dead peer is reported
# sooner, by the QP's retry-exceeded completion or the channel's heartbeat.
STALL_FLOOR_S = 10.0
SLOW_LINK_FACTOR = 100
SLOWEST_PORT_GBPS = 2.5        # SDR 1X, the slowest rate verbs names: the port's rate unknown


def stall_timeout_s(in_flight_bytes: int, port_gbps: float | None = None) -> float:
    """Seconds without a completion after which a loop's peer counts as stalled."""
    bytes_per_s = (port_gbps or SLOWEST_PORT_GBPS) * 1e9 / 8
    return STALL_FLOOR_S + SLOW_LINK_FACTOR * in_flight_bytes / bytes_per_s


def bandwidth_in_flight(size: int, qps: int, tx_depth: int, messages_per_qp: int | None) -> int:
    """The most bytes outstanding before a signalled completion: tx depth messages per QP,
    fewer when a QP sends fewer in all (messages_per_qp None: a -D run, unbounded)."""
    depth = tx_depth if messages_per_qp is None else min(tx_depth, messages_per_qp)
    return size * qps * depth


def latency_in_flight(size: int) -> int:
    """A round trip: one message each way."""
    return 2 * size


WC_RETRY_EXCEEDED = 12
WC_REMOTE_ACCESS_ERROR = 10


# How long a thread waiting on a loop with no heartbeat sleeps between looks (a signal
# still interrupts the wait; the loop's end and its passes wake it at once).
IDLE_LOOK_S = 0.5
# What PassGate.next returns once the loop has returned: no more passes will come.
LOOP_ENDED = "loop ended"

# What the command line turns into KeyboardInterrupt (cli/common.py terminate_as_interrupt).
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held_interrupts():
    """Ctrl-C and SIGTERM that arrive inside the block are raised when it ends. Blocking
    them in this thread's mask is not enough: the kernel hands a signal to any thread that
    has not blocked it, and Python runs the handler in the main thread at once. So the
    handlers are held, not the mask (and only the main thread runs Python handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    previous = {number: signal.signal(number, lambda signum, frame: arrived.append(signum))
                for number in INTERRUPTS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        for number in dict.fromkeys(arrived):
            signal.raise_signal(number)


class PassGate:
    """Between the bandwidth loop's passes: the loop's thread (calling the gate, as the
    loop's on_pass) hands each pass to the thread that owns the channel (:meth:`next`) and
    waits for its answer (:meth:`answer`), or for the stop flag."""

    ANSWER_POLL_S = 0.2   # how soon a waiting loop sees the stop flag

    def __init__(self, stop: _native.StopFlag):
        self._stop = stop
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._answers: queue.SimpleQueue = queue.SimpleQueue()

    def __call__(self, index: int, messages: int) -> bool:
        self._ready.put((index, messages))
        while not self._stop.is_set:
            try:
                return self._answers.get(timeout=self.ANSWER_POLL_S)
            except queue.Empty:
                continue
        return False

    def next(self, timeout_s: float) -> tuple[int, int] | str | None:
        """The pass that has landed (index, messages), or LOOP_ENDED once the loop has
        returned, whichever comes first within timeout_s; None if neither does."""
        try:
            return self._ready.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def loop_ended(self) -> None:
        """Called by the loop's thread as it returns: the waiting thread wakes at once and
        sees the round's end then, with no look every few milliseconds in between."""
        self._ready.put(LOOP_ENDED)

    def answer(self, go_on: bool) -> None:
        self._answers.put(go_on)


class LoopThread:
    """One C loop running in a worker thread with the GIL released, so Ctrl-C, heartbeats and
    the other side of the channel stay responsive; the loop polls ``stop`` to end early.
    The loop starts in :meth:`start` or :meth:`wait` and must not outlive the verbs objects
    it uses: every interrupt after that is raised where the loop is stopped first."""

    def __init__(self, loop, config, stop: _native.StopFlag, passes: PassGate | None = None):
        """passes: the gate the loop hands its passes to (its config's on_pass), told when
        the loop returns, however it was started (start() before wait(), or by wait())."""
        self.stop = stop
        self._outcome: dict = {}
        self._gate = passes
        self._thread = threading.Thread(target=self._target, args=(loop, config),
                                        name="gdrprobe-loop", daemon=True)

    def start(self) -> None:
        """Start the loop. Thread.start() waits for the thread to begin, and an interrupt
        raised inside that wait would leave the loop running unwatched while the caller
        tears down its QPs (a segmentation fault): the interrupts are held until start()
        returns, then raised in the caller, whose handler stops the loop."""
        with held_interrupts():
            self._thread.start()

    def _target(self, loop, config) -> None:
        try:
            self._outcome["value"] = loop(config, self.stop)
        except BaseException as error:   # handed to the caller's thread
            self._outcome["error"] = error
        finally:
            if self._gate is not None:
                self._gate.loop_ended()

    def wait(self, tick=None, tick_every_s: float = 2.0, on_pass=None):
        """Start the loop if it is not running yet; its result once it ends; tick, if given,
        is called every tick_every_s meanwhile (a heartbeat), and on_pass(index, messages)
        for each pass the loop hands to its gate (the loop goes on once it returns; the
        loop tells the gate when it returns, which ends the wait at once). On
        Ctrl-C, or an error in either, the loop is stopped before this re-raises, so no
        verbs object is torn down under it."""
        next_tick = time.monotonic() + tick_every_s
        try:
            if self._thread.ident is None:
                self.start()
            while self._thread.is_alive():
                # Waking only for the next heartbeat, a pass or the loop's end keeps this
                # thread off the CPUs the loop and the NIC's driver need; a signal still
                # interrupts the wait.
                wait_s = max(0.0, next_tick - time.monotonic()) if tick else IDLE_LOOK_S
                if self._gate is None:
                    self._thread.join(wait_s)
                elif (landed := self._gate.next(wait_s)) == LOOP_ENDED:
                    self._thread.join()
                elif landed is not None:
                    on_pass(*landed)
                    self._gate.answer(True)
                if tick is not None and time.monotonic() >= next_tick:
                    next_tick += tick_every_s
                    tick()
        except BaseException:
            self.finish()
            raise
        return self._result()

    def finish(self, grace_s: float = 0.0):
        """Stop the loop if it still runs after grace_s, wait for it (through further
        Ctrl-Cs) and return its result (None if it never started)."""
        if self._thread.ident is None:
            return None
        self._thread.join(grace_s)
        if self._thread.is_alive():
            self.stop.set()
        while self._thread.is_alive():
            try:
                self._thread.join()
            except KeyboardInterrupt:
                continue
        return self._result()

    def _result(self):
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome.get("value")


def check_status(result, what: str, stall_timeout: float) -> None:
    """Raise the error a person can act on for a loop (either result type) that did not
    finish."""
    status = result.status
    if status == _native.STATUS_OK:
        return
    if status == _native.STATUS_STOPPED:
        raise Interrupted(f"{what} was interrupted", "")
    if status == _native.STATUS_PASS:   # the pass check's own error is raised where it ran
        raise GdrprobeError(f"{what} stopped at the check of a pass, without an error",
                            "report this as a gdrprobe bug")
    if status == _native.STATUS_ARGS:   # gdrprobe's own configuration: a bug, never a drain
        raise GdrprobeError(f"{what} refused its configuration (a bug in gdrprobe)",
                            "report this as a gdrprobe bug")
    if status == _native.STATUS_STALL:
        raise PeerError(f"{what} made no progress for {stall_timeout:.1f} s (the time what "
                        f"was in flight needs on a link {SLOW_LINK_FACTOR}x slower than the "
                        "port's rate)", "the peer or the link stopped: check that the peer "
                        "is still running and the link is up")
    if status == _native.STATUS_WC:
        raise completion_error(result, what)
    detail = _native.STATUS_NAMES.get(status, str(status))
    if result.errno:
        detail += f" (errno {result.errno})"
    raise RdmaError(f"{what} failed: {detail}", "see 'gdrprobe doctor' and dmesg")


def completion_error(result, what: str) -> RdmaError:
    """The error of a loop that ended on a work completion with an error status."""
    name = _native.wc_status_str(result.wc_status)
    evidence = (f"work completion status {result.wc_status} ({name}), vendor error "
                f"0x{result.wc_vendor_err:x}, QP 0x{result.wc_qp_num:x}")
    if result.wc_status == WC_RETRY_EXCEEDED:
        return PeerError(f"{what} failed: the peer stopped acknowledging writes",
                         "check that the peer is still running and the link is up",
                         evidence=evidence)
    if result.wc_status == WC_REMOTE_ACCESS_ERROR:
        return CompletionError(f"{what} failed: the peer refused the write (remote access)",
                               "the peer's buffer or key changed; run again", evidence,
                               result.wc_status)
    return CompletionError(f"{what} failed", "see 'gdrprobe doctor' and dmesg", evidence,
                           result.wc_status)


def bandwidth_result(size: int, loop, integrity: Integrity,
                     stage_s_per_message: float = 0.0) -> BandwidthResult:
    """The report row of a bandwidth loop. A staged side copies every message once between
    GPU and host (stage_s_per_message, both sides together): that time is charged to the
    measured window, and stage_copy_gbps says what a pipeline overlapping the copies could
    reach. The loop's own result is left as the loop measured it."""
    seconds = loop.elapsed_ns / 1e9 + loop.messages * stage_s_per_message
    total = loop.messages * size
    average = total / seconds if seconds > 0 else 0.0
    peak = max(loop.peak_bytes_per_s, average)
    return BandwidthResult(
        size_bytes=size,
        iterations=loop.messages,
        elapsed_s=seconds,
        bandwidth_avg_gbps=average * 8 / 1e9,
        bandwidth_peak_gbps=peak * 8 / 1e9,
        bandwidth_avg_mib_s=average / (1 << 20),
        bandwidth_peak_mib_s=peak / (1 << 20),
        message_rate_mpps=loop.messages / seconds / 1e6 if seconds > 0 else 0.0,
        integrity=integrity,
        stage_copy_gbps=size * 8 / stage_s_per_message / 1e9 if stage_s_per_message > 0 else None,
        integrity_pause_s=loop.paused_ns / 1e9,
        integrity_passes=loop.passes,
        messages_posted=loop.posted,
    )


def bidir_result(forward: BandwidthResult, reverse: BandwidthResult) -> BidirResult:
    """One size of a bidirectional run: each direction's average and their sum."""
    return BidirResult(forward.size_bytes, forward.bandwidth_avg_gbps,
                       reverse.bandwidth_avg_gbps,
                       forward.bandwidth_avg_gbps + reverse.bandwidth_avg_gbps)


def one_way_us(round_trip_ns: float) -> float:
    """Half a round trip, in microseconds, as perftest reports latency."""
    return round_trip_ns / 2 / 1000


def latency_result(size: int, iterations: int, round_trip, integrity: Integrity,
                   one_way: bool = True) -> LatencyResult:
    """The report row of a latency loop's round trips (a RoundTripSummary): half of each
    (a WRITE ping-pong), or all of it (one_way=False: a READ is one operation whose
    completion comes back with its data), as perftest reports them (src/perftest_parameters.c
    print_report_lat: rtt_factor 1 for READ and atomics, 2 otherwise)."""
    def us(ns: float) -> float:
        return one_way_us(ns) if one_way else ns / 1000

    return LatencyResult(
        size_bytes=size,
        iterations=iterations,
        latency_us_min=us(round_trip.min_ns),
        latency_us_median=us(round_trip.median_ns),
        latency_us_mean=us(round_trip.mean_ns),
        latency_us_stdev=us(round_trip.stdev_ns),
        latency_us_p99=us(round_trip.p99_ns),
        latency_us_p999=us(round_trip.p999_ns),
        latency_us_max=us(round_trip.max_ns),
        integrity=integrity,
        elapsed_s=round_trip.mean_ns * round_trip.samples / 1e9,
    )

