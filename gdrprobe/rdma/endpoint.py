"""The control path: device, port, GID, PD, CQ and RC QPs through pyverbs.

An :class:`Endpoint` owns every verbs object it creates and releases them in reverse
order when it is closed, whatever happened before.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets

from gdrprobe.nccl import gid as nccl_gid
from gdrprobe.rdma import verbs
from gdrprobe.errors import NoDevice, PeerError, RdmaError, UsageError
from gdrprobe.rdma.devices import choose_device, open_failed, open_refusal
from gdrprobe.rdma.handles import RawHandles, raw_handles

QP_TIMEOUT = 14          # 4.096 us * 2^14 = 67 ms per retry
QP_RETRY_COUNT = 7
QP_RNR_RETRY = 7
QP_MIN_RNR_TIMER = 12
HOP_LIMIT = 64
LATENCY_MAX_INLINE = 220  # perftest's inline size for write latency
FLUSH_QP_DEPTH = 1        # one flush READ in flight: each is waited on


@dataclasses.dataclass(frozen=True)
class EndpointOptions:
    device: str | None = None
    port: int = 1
    gid_index: int | None = None
    num_qps: int = 1
    tx_depth: int = 128
    rx_depth: int = 1        # receives a QP may have posted (NCCL's pattern: 256, as NCCL)
    max_inline: int = 0
    mtu: int | None = None   # bytes; None: the port's active MTU
    remote_write: bool = True   # may the peer write through these QPs
    remote_read: bool = False   # may the peer READ through these QPs (an RDMA READ run)
    # What NCCL's GID choice asks for, where no GID index is given (NCCL's defaults).
    gid_preference: nccl_gid.GidPreference = nccl_gid.NCCL_DEFAULTS


@dataclasses.dataclass(frozen=True)
class EndpointAddress:
    """What the peer needs to connect to us; travels in the out-of-band handshake."""

    gid: str
    gid_index: int
    lid: int
    mtu: int
    qp_numbers: tuple[int, ...]
    psns: tuple[int, ...]
    # The RDMA READs this side's QPs answer at once (the max_dest_rd_atomic it sets):
    # the peer issues no more than that many (its max_rd_atomic).
    read_credits: int = 1


def choose_gid(ctx, port: int, port_attr, port_count: int, local_ip: str | None,
               gid_index: int | None, device: str,
               preference: nccl_gid.GidPreference = nccl_gid.NCCL_DEFAULTS) -> tuple[int, str, str]:
    """(index, GID, why): the given index; else on InfiniBand index 0; else on RoCE the
    RoCE v2 GID of the address the out-of-band connection uses, when the port has one (both
    ends then route to each other as that connection does), and otherwise the GID NCCL picks
    (:func:`gdrprobe.nccl.gid.nccl_gid_index`), which an IPv6-only port has too."""
    if gid_index is not None:
        if not 0 <= gid_index < port_attr.gid_tbl_len:
            raise UsageError(f"GID index {gid_index} is outside {device} port {port}'s table "
                             f"(0..{port_attr.gid_tbl_len - 1})", "see 'gdrprobe devices'")
        gid = ctx.query_gid(port, gid_index).gid
        if verbs.is_zero_gid(gid):
            raise UsageError(f"GID index {gid_index} of {device} port {port} is empty",
                             "pick a populated index from 'gdrprobe devices'")
        return gid_index, gid, f"GID index {gid_index} as given"
    if port_attr.link_layer != verbs.LINK_LAYER_ETHERNET:
        return 0, ctx.query_gid(port, 0).gid, "InfiniBand: GID index 0"
    populated = verbs.populated_gids(ctx, port, port_attr, port_count)
    for index, gid, gid_type in populated:
        if gid_type == verbs.ROCE_V2 and verbs.gid_ip_address(gid) == local_ip:
            return index, gid, f"the RoCE v2 GID of {local_ip}, the out-of-band address"
    index = nccl_gid.nccl_gid_index(populated, port_attr.gid_tbl_len, preference)
    found = {entry: (gid, kind) for entry, gid, kind in populated}
    if index not in found:
        raise NoDevice(f"{device} port {port} has no usable GID (its table is empty)",
                       "give the port's network interface an address and bring it up ('ip "
                       "addr', 'ip link set IFACE up'); GIDs follow its addresses")
    gid, kind = found[index]
    where = "" if local_ip is None or ipaddress.ip_address(local_ip).is_loopback else (
        f"{local_ip}, the out-of-band address, has no RoCE v2 GID here; ")
    return index, gid, (f"{where}the GID NCCL picks (ncclIbGetGidIndex, address family "
                        f"AF_INET{'' if preference.family == 4 else '6'}, RoCE v"
                        f"{preference.roce_version}): index {index}, {kind}")


MAX_READ_CREDITS = 255   # ibv_qp_attr's max_rd_atomic and max_dest_rd_atomic are uint8_t


def read_credits(device_attr) -> tuple[int, int]:
    """(READs a QP may have outstanding as requester, READs it answers at once as
    responder): the device's max_qp_init_rd_atom and max_qp_rd_atom, as perftest sets
    max_rd_atomic and max_dest_rd_atomic for its READ tests (linux-rdma/perftest
    src/perftest_parameters.c ctx_set_out_reads: the device's limit unless asked for less;
    src/perftest_resources.c ctx_modify_qp_to_rtr and _to_rts put it on the QP). At least 1:
    a device that reports 0 still answers one READ at a time."""
    def credits(value: int) -> int:
        return max(1, min(MAX_READ_CREDITS, value))
    return credits(device_attr.max_qp_init_rd_atom), credits(device_attr.max_qp_rd_atom)


def cq_entries(options: EndpointOptions) -> int:
    """The shared CQ: every send a QP may have outstanding, its receives, one spare."""
    return (options.tx_depth + options.rx_depth - 1) * options.num_qps + 1


def check_queue_limits(device: str, device_attr, options: EndpointOptions) -> None:
    """The queue depths against the device's limits (ibv_query_device), before any object
    is created, naming the limit that is exceeded."""
    entries = cq_entries(options)
    problems = []
    if options.tx_depth > device_attr.max_qp_wr:
        problems.append(f"TX depth {options.tx_depth} is over {device}'s max_qp_wr "
                        f"{device_attr.max_qp_wr}")
    if entries > device_attr.max_cqe:
        problems.append(f"(TX depth + RX depth - 1) x QPs + 1 = {entries} completion entries is over "
                        f"{device}'s max_cqe {device_attr.max_cqe}")
    if options.num_qps > device_attr.max_qp:
        problems.append(f"{options.num_qps} QPs is over {device}'s max_qp {device_attr.max_qp}")
    if problems:
        raise UsageError("; ".join(problems), "lower --tx-depth (-t) or --qp (-q)")


@dataclasses.dataclass(frozen=True)
class LoopbackQp:
    """A QP connected to itself and its own CQ (:meth:`Endpoint.loopback_qp`)."""

    qp: object
    cq: object

    def handles(self) -> RawHandles:
        return raw_handles([self.qp], self.cq)

    def close(self) -> None:
        """The QP, then its CQ; safe to call twice (the endpoint closes them again)."""
        self.qp.close()
        self.cq.close()


class Endpoint:
    """One device context with a PD, a shared CQ and num_qps RC QPs in INIT state."""

    def __init__(self, options: EndpointOptions, local_ip: str | None):
        self.options = options
        self.objects: list = []   # every pyverbs object, in creation order
        self.qps: list = []
        pv = verbs.pyverbs()
        self.device, skipped = choose_device(options.device)
        self.notes: tuple[str, ...] = skipped   # why this device and GID, for the report
        try:
            self._open(pv, local_ip)
        except BaseException:
            self.close()
            raise

    def _keep(self, obj):
        self.objects.append(obj)
        return obj

    def _verbs(self, pv, what: str, make, fix: str = ""):
        """make()'s pyverbs object, or the RdmaError that says which step failed."""
        try:
            return make()
        except pv.PyverbsError as error:
            raise RdmaError(f"{what} on {self.device} failed",
                            fix or "check 'dmesg' and 'gdrprobe doctor'",
                            evidence=str(error).splitlines()[0]) from error

    def _open_context(self, pv):
        try:
            return self._keep(pv.device.Context(name=self.device))
        except pv.PyverbsError as error:
            # Say why from the node itself; pyverbs' text alone is "Failed to open device".
            refusal = open_refusal(self.device)
            code = getattr(error, "error_code", -1)
            raise open_failed(self.device, *(refusal or (code, str(error).splitlines()[0]))) \
                from error

    def _open(self, pv, local_ip: str | None) -> None:
        options = self.options
        self.ctx = self._open_context(pv)
        device_attr = self._verbs(pv, "ibv_query_device", self.ctx.query_device)
        if not 1 <= options.port <= device_attr.phys_port_cnt:
            raise UsageError(f"{self.device} has no port {options.port}",
                             f"use a port from 1 to {device_attr.phys_port_cnt}")
        self.port_attr = self._verbs(pv, f"ibv_query_port({options.port})",
                                     lambda: self.ctx.query_port(options.port))
        if self.port_attr.state != verbs.IBV_PORT_ACTIVE:
            state = verbs.PORT_STATES.get(self.port_attr.state, self.port_attr.state)
            raise NoDevice(f"{self.device} port {options.port} is {state}, not ACTIVE",
                           "bring the link up (cable, switch port, 'ip link set IFACE up' "
                           "for RoCE) and check 'gdrprobe devices'")
        self.gid_index, self.gid, gid_reason = self._verbs(
            pv, "reading the GID table", lambda: choose_gid(
                self.ctx, options.port, self.port_attr, device_attr.phys_port_cnt, local_ip,
                options.gid_index, self.device, options.gid_preference))
        self.notes += (f"GID {self.gid_index}: {gid_reason}",)
        check_queue_limits(self.device, device_attr, options)
        self.reads_out, self.reads_in = read_credits(device_attr)
        self.pd = self._keep(self._verbs(pv, "allocating a protection domain",
                                         lambda: pv.pd.PD(self.ctx)))
        entries = cq_entries(options)
        self.cq = self._keep(self._verbs(
            pv, f"creating a CQ of {entries} entries", lambda: pv.cq.CQ(self.ctx, entries),
            "check the locked-memory limit ('gdrprobe doctor') and 'dmesg'"))
        try:
            for _ in range(options.num_qps):
                self.qps.append(self._keep(self._create_qp(pv, options.max_inline,
                                                           rx_depth=options.rx_depth)))
        except pv.PyverbsRDMAError as error:
            if options.max_inline and not self._takes_inline(pv, options.max_inline):
                largest = self._largest_inline(pv, options.max_inline)
                raise UsageError(f"{self.device} takes at most {largest} inline bytes per "
                                 f"message (max_inline_data); {options.max_inline} were asked",
                                 f"use -I {largest} or less") from error
            raise RdmaError(f"creating an RC QP on {self.device} failed",
                            "check the locked-memory limit ('gdrprobe doctor') and 'dmesg'",
                            evidence=str(error).splitlines()[0]) from error
        self.psns = tuple(secrets.randbelow(1 << 24) for _ in self.qps)

    def _takes_inline(self, pv, max_inline: int) -> bool:
        """Whether a QP with this inline size can be created (verbs has no attribute for
        the device's largest: trying is the only way to know)."""
        try:
            self._create_qp(pv, max_inline, tx_depth=1).close()
            return True
        except pv.PyverbsRDMAError:
            return False

    def _largest_inline(self, pv, refused: int) -> int:
        """The largest inline size below `refused` the device takes (a bisection)."""
        low, high = 0, refused   # low is taken (0 always is), high is not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self._takes_inline(pv, middle) else (low, middle)
        return low

    def _create_qp(self, pv, max_inline: int, tx_depth: int | None = None, cq=None,
                   access: int | None = None, rx_depth: int = 1):
        e = pv.enums
        cq = cq or self.cq
        cap = pv.qp.QPCap(max_send_wr=tx_depth or self.options.tx_depth,
                          max_recv_wr=rx_depth,
                          max_send_sge=1, max_recv_sge=1, max_inline_data=max_inline)
        init = pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0)
        attr = pv.qp.QPAttr(qp_state=e.IBV_QPS_INIT, port_num=self.options.port)
        attr.qp_access_flags = self._access_flags(pv) if access is None else access
        return pv.qp.QP(self.pd, init, attr)

    def _access_flags(self, pv) -> int:
        remote = pv.enums.IBV_ACCESS_REMOTE_WRITE if self.options.remote_write else 0
        if self.options.remote_read:
            remote |= pv.enums.IBV_ACCESS_REMOTE_READ
        return pv.enums.IBV_ACCESS_LOCAL_WRITE | remote

    def loopback_qp(self, depth: int = FLUSH_QP_DEPTH) -> LoopbackQp:
        """NCCL's flush QP (net_ib connect.cc gpuFlush.qp): an RC QP on this endpoint's PD,
        allowed remote reads and connected to itself, with a CQ of its own so that nothing
        else completes there; depth READs may be in flight on it (NCCL's pattern: one per
        step in flight). Released with the endpoint (or before, by its close())."""
        pv = verbs.pyverbs()
        cq = self._keep(self._verbs(pv, "creating the flush QP's CQ",
                                    lambda: pv.cq.CQ(self.ctx, depth + 1)))
        access = pv.enums.IBV_ACCESS_LOCAL_WRITE | pv.enums.IBV_ACCESS_REMOTE_READ
        qp = self._keep(self._verbs(pv, "creating the flush QP", lambda: self._create_qp(
            pv, 0, tx_depth=depth, cq=cq, access=access)))
        psn = secrets.randbelow(1 << 24)
        self._to_rts(pv, qp, psn, qp.qp_num, psn, self.gid, self.port_attr.lid,
                     verbs.mtu_enum(self.mtu), access)
        return LoopbackQp(qp, cq)

    @property
    def mtu(self) -> int:
        active = verbs.mtu_bytes(self.port_attr.active_mtu)
        return min(active, self.options.mtu) if self.options.mtu else active

    def address(self) -> EndpointAddress:
        return EndpointAddress(gid=self.gid, gid_index=self.gid_index, lid=self.port_attr.lid,
                               mtu=self.mtu, qp_numbers=tuple(qp.qp_num for qp in self.qps),
                               psns=self.psns, read_credits=self.reads_in)

    def connect(self, remote: EndpointAddress) -> None:
        """Move every QP through RTR to RTS towards the peer's matching QP."""
        pv = verbs.pyverbs()
        if len(remote.qp_numbers) != len(self.qps):
            # Both ends build their QPs from the one run's options: a peer that did not is
            # the peer's (or a gdrprobe of another version), never a fault of this node.
            raise PeerError(f"the peer has {len(remote.qp_numbers)} QPs, this side "
                            f"{len(self.qps)}", "run the same gdrprobe version on both sides")
        path_mtu = verbs.mtu_enum(min(self.mtu, remote.mtu))
        for qp, local_psn, remote_qpn, remote_psn in zip(self.qps, self.psns,
                                                         remote.qp_numbers, remote.psns):
            self._to_rts(pv, qp, local_psn, remote_qpn, remote_psn, remote.gid, remote.lid,
                         path_mtu, self._access_flags(pv),
                         (min(self.reads_out, remote.read_credits), self.reads_in))

    def _to_rts(self, pv, qp, local_psn: int, remote_qpn: int, remote_psn: int,
                remote_gid: str, remote_lid: int, path_mtu: int, access: int,
                reads: tuple[int, int] = (1, 1)) -> None:
        """One QP through RTR to RTS towards the remote QP (its own number: a loopback);
        reads: its (max_rd_atomic, max_dest_rd_atomic), never more READs out than the peer
        answers at once."""
        attr = pv.qp.QPAttr(port_num=self.options.port)
        attr.qp_access_flags = access
        attr.path_mtu = path_mtu
        attr.dest_qp_num, attr.rq_psn, attr.sq_psn = remote_qpn, remote_psn, local_psn
        attr.max_rd_atomic, attr.max_dest_rd_atomic = reads
        attr.min_rnr_timer = QP_MIN_RNR_TIMER
        attr.timeout, attr.retry_cnt, attr.rnr_retry = QP_TIMEOUT, QP_RETRY_COUNT, QP_RNR_RETRY
        route = pv.addr.GlobalRoute(dgid=pv.addr.GID(remote_gid), sgid_index=self.gid_index,
                                    hop_limit=HOP_LIMIT)
        attr.ah_attr = pv.addr.AHAttr(port_num=self.options.port, is_global=1, gr=route,
                                      dlid=remote_lid)
        try:
            qp.to_rts(attr)
        except pv.PyverbsRDMAError as error:
            raise RdmaError(f"connecting QP {qp.qp_num} to the peer's QP {remote_qpn} "
                            "failed", "check that both sides use GIDs of the same type "
                            "and reachable addresses ('gdrprobe devices')",
                            evidence=str(error).splitlines()[0]) from error

    def handles(self) -> RawHandles:
        return raw_handles(self.qps, self.cq)

    def close(self) -> None:
        """Destroy QPs, CQ, PD and the context, newest first; safe to call twice. One
        object failing to close does not keep the others open."""
        self.qps = []
        failures = []
        while self.objects:
            try:
                self.objects.pop().close()
            except Exception as error:   # close the rest, then report the first failure
                failures.append(error)
        if failures:
            raise failures[0]

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
