"""How NCCL's IB transport paces one connection, and the settings of it the job's
environment holds: what the NCCL-pattern arm (``--pattern nccl``) reproduces.

Every rule cites NVIDIA/nccl v2.30.7-1:

- ``src/include/device.h``: ``NCCL_STEPS`` 8, the steps in flight per connection
  (``src/transport/net.cc`` sendProxyProgress and recvProxyProgress: ``maxDepth =
  min(NCCL_STEPS, NCCL_SHARED_STEPS / nsubs)``, 8 for one peer);
- ``src/init.cc``: ``NCCL_P2P_NET_CHUNKSIZE`` (128 KiB, a point-to-point step between nodes;
  doubled on Arm CPUs with compute capability 10.0 GPUs, which gdrprobe does not model),
  ``NCCL_BUFFSIZE`` (4 MiB; a Simple-protocol collective's step is buffSize / NCCL_STEPS,
  net.cc ``stepSize``), ``NCCL_NCHANNELS_PER_NET_PEER``;
- ``src/graph/paths.cc`` ncclTopoGetNchannels: point-to-point channels to a peer across
  the network, without NCCL_NCHANNELS_PER_NET_PEER, ``max(netCount, divUp(netBw,
  NCCL_P2P_PER_CHANNEL_NET_BW))`` (14 GB/s), rounded up to a power of two
  (ncclTopoComputeP2pChannels);
- ``src/transport/net_ib/connect.cc``: ``NCCL_IB_QPS_PER_CONNECTION`` (1),
  ``NCCL_IB_USE_INLINE`` (0: the clear-to-send is not inline); ``common.cc``:
  ``NCCL_IB_SPLIT_DATA_ON_QPS`` (0: a step on one QP, the QPs taken in turn);
  ``init.cc``: ``NCCL_IB_ADAPTIVE_ROUTING`` (-2: on for InfiniBand ports, off for RoCE);
  ``p2p.cc``: ``NCCL_IB_AR_THRESHOLD`` (8192: with adaptive routing a larger step's data is
  a WRITE followed by a zero-byte WRITE with immediate). With ``NCCL_IB_OOO_RQ`` NCCL
  ignores the threshold (init.cc); gdrprobe models NCCL's default (no out-of-order RQ).

Collectives' channel count comes from NCCL's graph search over the whole topology, which
gdrprobe does not reproduce: the collective step shape runs the point-to-point channels.
Pure: the environment is handed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.errors import UsageError
from gdrprobe.nccl import params

STEPS = 8                       # NCCL_STEPS
DEFAULT_BUFFSIZE = 1 << 22      # DEFAULT_BUFFSIZE, init.cc
DEFAULT_P2P_CHUNK = 1 << 17     # NCCL_P2P_NET_CHUNKSIZE's default
DEFAULT_AR_THRESHOLD = 8192     # ncclIbArThreshold, p2p.cc
P2P_PER_CHANNEL_NET_BW = 14     # NCCL_P2P_PER_CHANNEL_NET_BW's default, GB/s
MAX_CHANNELS = 32               # what gdrprobe's loop runs at once (csrc/gdr_nccl.h)
MAX_QPS = 64                    # channels x QPs per connection (csrc/gdr_loop.h GDR_MAX_QPS)
P2P = "p2p"                     # a point-to-point step: NCCL_P2P_NET_CHUNKSIZE
COLLECTIVE = "collective"       # a Simple-protocol collective's step: NCCL_BUFFSIZE / 8

# The variables that shape a connection's steps, each declared in gdrprobe.nccl.params.
VARIABLES = (params.IB_QPS_PER_CONNECTION, params.IB_SPLIT_DATA_ON_QPS, params.IB_ADAPTIVE_ROUTING,
             params.IB_AR_THRESHOLD, params.IB_USE_INLINE, params.P2P_NET_CHUNKSIZE,
             params.BUFFSIZE, params.NCHANNELS_PER_NET_PEER, params.P2P_PER_CHANNEL_NET_BW)


@dataclasses.dataclass(frozen=True)
class NcclTransport:
    """The settings of NCCL's IB transport that shape a connection's steps, as the job's
    NCCL reads them; ``set`` names the variables the environment gave."""

    qps_per_connection: int = 1
    split_data_on_qps: bool = False
    adaptive_routing: int = -2          # -2: NCCL's default, by the port's link layer
    ar_threshold: int = DEFAULT_AR_THRESHOLD
    use_inline: bool = False
    p2p_chunk: int = DEFAULT_P2P_CHUNK
    buffsize: int = DEFAULT_BUFFSIZE
    channels_per_net_peer: int | None = None   # None: NCCL's rule by the NIC's bandwidth
    p2p_per_channel_net_bw: int = P2P_PER_CHANNEL_NET_BW
    set: tuple[str, ...] = ()

    def step_sizes(self) -> tuple[tuple[str, int], ...]:
        """The steps NCCL moves over this connection: (shape, bytes), point-to-point first."""
        shapes = ((P2P, self.p2p_chunk), (COLLECTIVE, self.buffsize // STEPS))
        return tuple(shape for shape in shapes if shape[1] > 0)

    def adaptive_routing_on(self, infiniband: bool) -> bool:
        """comm->ar: NCCL_IB_ADAPTIVE_ROUTING where set, else on for an InfiniBand port."""
        return infiniband if self.adaptive_routing == -2 else self.adaptive_routing != 0

    def channels(self, nic_gbps: float | None) -> int:
        """Point-to-point channels to one peer over the network (ncclTopoGetNchannels): the
        variable where set (a value of 0 or less is ignored, init.cc), else one per NIC, more
        where the NIC is faster than NCCL_P2P_PER_CHANNEL_NET_BW; a power of two."""
        if self.channels_per_net_peer is not None and self.channels_per_net_peer > 0:
            count = self.channels_per_net_peer
        else:
            gbytes = int((nic_gbps or 0.0) / 8)
            count = max(1, -(-gbytes // max(1, self.p2p_per_channel_net_bw)))
        return min(MAX_CHANNELS, 1 << (count - 1).bit_length())

    def variable(self, name: str, value) -> str:
        """A variable and its value as a line of the answer: "(set)" or "(NCCL's default)"."""
        return f"{name}={value} ({'set' if name in self.set else 'NCCL default'})"


def transport_settings(environ: Mapping[str, str]) -> NcclTransport:
    """The one reading of the transport's variables from the job's environment, each through
    its declaration (gdrprobe.nccl.params: read as NCCL's NCCL_PARAM reads it, NCCL 2.30.7's
    default where unset). A value gdrprobe cannot run (more QPs than its loop has, a step of
    no bytes) is refused before anything runs."""
    def read(param: params.Param) -> int:
        return param.number(environ)

    channels = read(params.NCHANNELS_PER_NET_PEER)      # unset: NCCL_CONFIG_UNDEF_INT
    ar_threshold = read(params.IB_AR_THRESHOLD)          # -2: ncclIbArThreshold's 8192 (init.cc)
    buffsize = read(params.BUFFSIZE)                     # -2: DEFAULT_BUFFSIZE (init.cc)
    transport = NcclTransport(
        qps_per_connection=read(params.IB_QPS_PER_CONNECTION),
        split_data_on_qps=read(params.IB_SPLIT_DATA_ON_QPS) == 1,
        adaptive_routing=read(params.IB_ADAPTIVE_ROUTING),
        ar_threshold=DEFAULT_AR_THRESHOLD if ar_threshold == -2 else ar_threshold,
        use_inline=read(params.IB_USE_INLINE) != 0,
        p2p_chunk=read(params.P2P_NET_CHUNKSIZE),
        buffsize=DEFAULT_BUFFSIZE if buffsize == -2 else buffsize,
        channels_per_net_peer=channels if channels > 0 else None,
        p2p_per_channel_net_bw=read(params.P2P_PER_CHANNEL_NET_BW),
        set=tuple(param.name for param in VARIABLES if environ.get(param.name)))
    check_transport(transport)
    return transport


def check_transport(transport: NcclTransport) -> None:
    problems = []
    if not 1 <= transport.qps_per_connection <= MAX_QPS:
        problems.append(f"NCCL_IB_QPS_PER_CONNECTION={transport.qps_per_connection}: gdrprobe "
                        f"runs 1 to {MAX_QPS} QPs per connection")
    if transport.p2p_chunk < 1 or transport.buffsize < STEPS:
        problems.append(f"NCCL_P2P_NET_CHUNKSIZE={transport.p2p_chunk} and NCCL_BUFFSIZE="
                        f"{transport.buffsize} must give steps of at least a byte")
    if max(transport.p2p_chunk, transport.buffsize // STEPS) > 1 << 30:
        problems.append("a step over 1 GiB (NCCL_P2P_NET_CHUNKSIZE, NCCL_BUFFSIZE / 8)")
    if problems:
        raise UsageError("the job's NCCL settings give a connection gdrprobe cannot run: "
                         + "; ".join(problems), "unset or lower the variable named")
