"""Other traffic on the NIC's port while a check measures: the port's own counters, read
before and after each run, against what the run itself put on the wire.

A check on a node that jobs share may meet another job's transfers on the same port: its
arms then share the link, and a GPU arm that shared it more than the host arm looks
degraded (or a host arm that did makes a degraded GPU arm look engaged). Such an answer is
inconclusive (exit 12), never a drain (:func:`gdrprobe.campaign.verdict.disturbed`).

The counters, read through sysfs:

- ``ports/N/counters/port_xmit_data`` and ``port_rcv_data``: "Total number of data octets,
  divided by 4 (lanes), transmitted (received) on all VLs", 64-bit (Linux
  ``Documentation/ABI/stable/sysfs-class-infiniband``; the IBA's PortXmitData and
  PortRcvData). The RDMA core makes this group only for a device that answers performance
  MADs (``drivers/infiniband/core/sysfs.c``, ``add_port``: ``device->ops.process_mad``).
- Soft-RoCE (rxe) answers none, but counts its packets in ``ports/N/hw_counters/sent_pkts``
  and ``rcvd_pkts`` (``drivers/infiniband/sw/rxe/rxe_hw_counters.c``; every packet rxe
  sends or accepts, requests and acknowledgements alike).

What a run put on the wire: every message it posted (warm-up and window,
``BandwidthResult.messages_posted``), each ``ceil(size / path MTU)`` request packets; in
loopback both ends are this port, so the same traffic is sent and received here. On top of
the payload the counters see headers and acknowledgements:

- octets: at most HEADER_BYTES per request packet, and as many acknowledgements of
  HEADER_BYTES as there were request packets (the most a responder that acknowledges every
  packet sends; hardware coalesces them);
- rxe's packets: rxe asks for an acknowledgement on the last packet of a message and on
  every packet that finds more than RXE_MAX_PKT_PER_ACK (64) unacknowledged ones before
  it (``drivers/infiniband/sw/rxe/rxe_req.c``, ``init_req_packet``; ``rxe_param.h``), so a
  message of p packets draws at most ``(p - 1) // 66 + 1`` acknowledgements.

Retransmissions. A requester whose acknowledgement comes late sends its packets again (rxe
goes back to the first unacknowledged one on its retransmit timer, ``rxe_comp.c``
COMPST_ERROR_RETRY), and the responder counts each such packet it receives a second time
in ``hw_counters/duplicate_request``, and one that arrived ahead of a missing one (and is
sent again) in ``out_of_seq_request`` (rxe, ``rxe_resp.c`` check_psn) or ``out_of_sequence``
(mlx5). Each is the run's own, and the responder acknowledges every duplicate again
(``rxe_resp.c`` duplicate_request; the IBA's rule for duplicate requests), so each costs a
request packet and an acknowledgement on top: both ways in loopback, where both ends are
this port; against a server, the request in and the acknowledgement out. Where the counters
count octets a request packet is its path MTU and headers, an acknowledgement its headers.
Emulated NICs stalled by their host resend often; hardware seldom does.

Tolerance. Other traffic F sharing a saturated link with the run's own P takes F / (P + F)
of it; the verdict turns when an arm loses 1 - threshold of its bandwidth (0.1 at 0.9), so
other traffic of at least (1 - threshold) / threshold of the run's own payload (0.11 at
0.9) can decide the answer by itself. More than that, beyond the headers and
acknowledgements allowed above, in either direction, makes the run disturbed. Counters that
moved less than half the run's own payload do not count this port's traffic (a 32-bit
counter stuck at its maximum, a device that counts elsewhere): the check then says so and
judges nothing by them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from gdrprobe.report.model import RunReport
from gdrprobe.sysroot import SysRoot

OCTETS, PACKETS = "octets", "packets"
# The largest per-packet header of an RDMA WRITE: RoCE v2 over IPv6 with a VLAN tag (Ethernet
# 14 + 802.1Q 4 + IPv6 40 + UDP 8 + BTH 12 + RETH 16 + ICRC 4 + FCS 4 = 102); InfiniBand with
# a GRH needs less (LRH 8 + GRH 40 + BTH 12 + RETH 16 + ICRC 4 + VCRC 2 = 82).
HEADER_BYTES = 102
RXE_MAX_PKT_PER_ACK = 64          # rxe_param.h
RXE_PACKETS_PER_ACK = RXE_MAX_PKT_PER_ACK + 2   # the packet that finds 65 before it asks
# The counters' data fields count 4-octet words (sysfs-class-infiniband: "divided by 4").
DATA_WORD = 4
# A responder's count of requests it received again or out of order: rxe's names
# (rxe_hw_counters.c), and mlx5's out_of_sequence (its duplicate_request is rxe's name too).
RESENT_COUNTERS = ("duplicate_request", "out_of_seq_request", "out_of_sequence")


@dataclasses.dataclass(frozen=True)
class PortCounts:
    """One reading of a port's counters: what it sent and received, in `unit`."""

    unit: str            # octets | packets
    sent: int
    received: int
    source: str          # the files read
    resent: int = 0      # packets received again or out of order (RESENT_COUNTERS)


def read_counts(device: str, port: int, root: SysRoot | None = None) -> PortCounts | None:
    """The port's traffic so far (None: this device keeps no counters gdrprobe reads)."""
    root = root or SysRoot()
    base = f"/sys/class/infiniband/{device}/ports/{port}"
    pairs = ((OCTETS, DATA_WORD, f"{base}/counters", "port_xmit_data", "port_rcv_data"),
             (PACKETS, 1, f"{base}/hw_counters", "sent_pkts", "rcvd_pkts"),
             (PACKETS, 1, f"/sys/class/infiniband/{device}/hw_counters", "sent_pkts",
              "rcvd_pkts"))
    for unit, scale, folder, sent_name, received_name in pairs:
        sent = _number(root.read(f"{folder}/{sent_name}"))
        received = _number(root.read(f"{folder}/{received_name}"))
        if sent is not None and received is not None:
            return PortCounts(unit, sent * scale, received * scale,
                              f"{folder}/{{{sent_name},{received_name}}}",
                              resent_packets(root, f"{base}/hw_counters"))
    return None


def resent_packets(root: SysRoot, folder: str) -> int:
    return sum(_number(root.read(f"{folder}/{name}")) or 0 for name in RESENT_COUNTERS)


def _number(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class OwnTraffic:
    """What one run put on the wire, in a counter's unit: its payload, and the most the
    counters may add to it for headers and acknowledgements, out and in; and what each
    packet its responders received again adds, out and in (the request and its new
    acknowledgement)."""

    payload: int
    sent_most: int
    received_most: int
    per_resend_out: int = 2
    per_resend_in: int = 2


def own_traffic(report: RunReport, unit: str, loopback: bool) -> OwnTraffic:
    """The run's own traffic as the port's counters count it (loopback: both ends here)."""
    mtu = max(1, min(report.local.mtu_bytes, report.remote.mtu_bytes))
    payload = requests = acks = 0
    for row in report.bandwidth:
        packets = -(-row.size_bytes // mtu)
        posted = row.messages_posted
        requests += posted * packets
        if unit == OCTETS:
            payload += posted * row.size_bytes
            acks += posted * packets * HEADER_BYTES
        else:
            acks += posted * ((packets - 1) // RXE_PACKETS_PER_ACK + 1)
    if unit == OCTETS:
        out = payload + requests * HEADER_BYTES
    else:
        payload = out = requests
    # Requests leave this port; acknowledgements come back (loopback: both leave and arrive).
    request, ack = (mtu + HEADER_BYTES, HEADER_BYTES) if unit == OCTETS else (1, 1)
    resend = request + ack
    return OwnTraffic(payload, out + (acks if loopback else 0), acks + (out if loopback else 0),
                      per_resend_out=resend if loopback else ack,
                      per_resend_in=resend if loopback else request)


def tolerance(threshold: float) -> float:
    """The share of a run's own payload other traffic may reach before it could decide the
    verdict by itself: (1 - threshold) / threshold."""
    return (1 - threshold) / threshold


def foreign_line(before: PortCounts, after: PortCounts, own: OwnTraffic,
                 threshold: float) -> str | None:
    """A line saying what other traffic crossed the port during the run, when it is more
    than the tolerance; None when the run had the port to itself."""
    sent, received = after.sent - before.sent, after.received - before.received
    resent = max(0, after.resent - before.resent)
    sent_most = own.sent_most + resent * own.per_resend_out
    received_most = own.received_most + resent * own.per_resend_in
    excess = max(sent - sent_most, received - received_most)
    if excess <= tolerance(threshold) * own.payload:
        return None
    again = f" (with {resent} packets its responders received again)" if resent else ""
    return (f"the port sent {sent} and received {received} {after.unit} while the run's own "
            f"traffic was at most {sent_most} out and {received_most} in{again}: "
            f"{excess} {after.unit} more, over {tolerance(threshold):.2f} of the run's "
            f"{own.payload}")


class PortWatch:
    """run_once(local, remote) that reads the port's counters around each run and keeps a
    line for each run other traffic disturbed (:attr:`foreign`) and what the watch could
    and could not see (:meth:`describe`)."""

    def __init__(self, device: str, port: int, threshold: float, loopback: bool,
                 read: Callable[[str, int], PortCounts | None] | None = None):
        self.device, self.port = device, port
        self.threshold, self.loopback = threshold, loopback
        self.read = read or (lambda name, number: read_counts(name, number))
        self.runs = 0
        self.foreign: list[str] = []
        self.blind = ""          # why the counters said nothing, where they did not

    def wrap(self, run_once):
        def watched(local, remote) -> RunReport:
            before = self.read(self.device, self.port)
            report = run_once(local, remote)
            self.judge(before, self.read(self.device, self.port), report)
            return report
        return watched

    def judge(self, before: PortCounts | None, after: PortCounts | None,
              report: RunReport) -> None:
        self.runs += 1
        if before is None or after is None:
            self.blind = f"{self.device} port {self.port} keeps no traffic counters gdrprobe reads"
            return
        own = own_traffic(report, after.unit, self.loopback)
        if after.sent - before.sent < own.payload / 2:
            self.blind = (f"{after.source} moved less than half of a run's own traffic: they "
                          "do not count this port's traffic (a 32-bit counter at its maximum?)")
            return
        line = foreign_line(before, after, own, self.threshold)
        if line is not None:
            self.foreign.append(f"run {self.runs} on {self.device} port {self.port}: {line}")

    def describe(self) -> str:
        if self.blind:
            return f"not watched: {self.blind}"
        seen = f"other traffic in {len(self.foreign)} of {self.runs} runs" if self.foreign \
            else f"no other traffic in {self.runs} runs"
        return (f"{self.device} port {self.port}'s counters read around each run: {seen} "
                f"(tolerance {tolerance(self.threshold):.2f} of each run's own)")
