"""Does NCCL flush a GPUDirect receive into this GPU, and is the flush forced?

NCCL's flush: when a receive that the NIC wrote straight into GPU memory completes, NCCL's
proxy (``src/transport/net.cc`` recvProxyProgress, protocol SIMPLE) calls the network's
``iflush``; the IB transport (``src/transport/net_ib/p2p.cc`` ncclIbIflush) posts a signalled
RDMA READ of **1 byte at the start of the last non-empty receive buffer**, with that
buffer's rkey, into a 4-byte host integer (``gpuFlushHostMem``, registered LOCAL_WRITE), on
``gpuFlush.qp``: an RC QP on the receive's PD and CQ, allowed REMOTE_READ and connected to
itself (``connect.cc``). The receive counts as done only when the READ has completed: the
NIC's read of GPU memory cannot pass its earlier writes there, so they have landed.

Whether NCCL flushes, by NVIDIA/nccl release (the first tag with each rule):

- The IB transport flushes at all only where it enabled its flush QP (``connect.cc``
  ``flushEnabled``): peer memory is available (ncclIbGdrSupport) and ``NCCL_GDR_FLUSH_DISABLE``
  is 0; from 2.18.3 DMA-BUF on the NIC (ncclIbDmaBufSupport) counts too. Before 2.18.3 a
  node that registers through DMA-BUF without a peer-memory module never flushes.
- Before 2.15.1 every GPUDirect receive is flushed (net.cc: ``useGdr``).
- From 2.15.1 ``src/graph/paths.cc`` ncclTopoNeedFlush decides: GPUs before sm90 always;
  sm90 and later only with ``NCCL_NET_FORCE_FLUSH`` (default 1, so still always, until
  2.19.1, which makes it 0: "Disable network flush by default on H100").
- From 2.24.3 a network device whose properties say ``forceFlush`` is flushed whatever the
  GPU; the IB transport sets it from 2.27.3 to 2.30.7 for mlx5 data-direct devices
  (``init.cc`` ncclIbGetPhysProperties: ``capsProvider.mlx5.dataDirect``; NCCL names such a
  device ``<dev>_dma``, found through ``mlx5dv_get_data_direct_sysfs_path`` unless
  ``NCCL_IB_DATA_DIRECT=0``); 2.31 no longer does (the C2C rule below still flushes a
  Grace GPU's receives through it).
- From 2.26.2 a GPU that reaches its CPU over C2C (Grace) and its NIC over PCIe (path type
  PXB or nearer) is flushed whatever its architecture: completions and flags travel over
  C2C while the data takes PCIe (2.30.3 names this ``ncclTopoFlushC2c``).

Not modelled: with GDRCopy enabled (``NCCL_GDRCOPY_ENABLE=1``, off by default) NCCL may flush
by a CPU load through GDRCopy instead of the READ (``NCCL_GDRCOPY_FLUSH_ENABLE``), and from
2.30.3 skips a C2C flush where GDRCopy maps its flags through PCIe (``ncclGdcPinFlag``);
plugins other than NCCL's IB transport flush their own way.

The version constants below belong with :mod:`gdrprobe.nccl.versions` (to be moved there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.nccl.decision import NodeFacts
from gdrprobe.nccl import params
from gdrprobe.nccl.topo import PATH_RANK
from gdrprobe.nccl.versions import DATA_DIRECT_FORCE_FLUSH_UNTIL, DATA_DIRECT_SINCE, MODELLED, Version
from gdrprobe.report.model import NcclGpuDecision

NEED_FLUSH_SINCE: Version = (2, 15, 1)          # paths.cc ncclTopoNeedFlush
FORCE_FLUSH_OFF_SINCE: Version = params.NET_FORCE_FLUSH.first_with(0)   # its default 1 -> 0
FLUSH_ON_DMABUF_SINCE: Version = (2, 18, 3)     # connect.cc flushEnabled: DMA-BUF counts
FORCE_FLUSH_PROPERTY_SINCE: Version = (2, 24, 3)   # ncclNetProperties_t.forceFlush read
C2C_FLUSH_SINCE: Version = (2, 26, 2)           # C2C CPU with a PCIe NIC
DATA_DIRECT_FLUSH_SINCE: Version = DATA_DIRECT_SINCE   # init.cc forceFlush on data-direct devices

HOPPER = 90              # "Flush is required on Ampere and earlier" (paths.cc)
NEAREST_PCIE_PATH = "PXB"   # the C2C rule: gpu->paths[NET].type <= PATH_PXB

# Short names of the rules, as the report gives them.
NO_GDR = "no GPUDirect receive"
DISABLED = params.GDR_FLUSH_DISABLE.name
NO_FLUSH_QP = "no peer memory"
EVERY_RECEIVE = "every GPUDirect receive"
PRE_HOPPER = "GPU before sm90"
UNKNOWN_GPU = "GPU architecture unknown"
FORCED_BY_ENV = params.NET_FORCE_FLUSH.name
DATA_DIRECT = "data-direct NIC"
C2C = "C2C CPU with a PCIe NIC"
ORDERED = "sm90 or later"
UNKNOWN_DECISION = "NCCL's decision unknown"


@dataclasses.dataclass(frozen=True)
class NcclFlush:
    """NCCL's answer for one GPU's GPUDirect receives."""

    flushes: bool      # NCCL reads back every receive with an RDMA READ before using it
    forced: bool       # ... whatever the GPU's architecture (a data-direct NIC, C2C, a setting)
    rule: str          # which rule decided (the names above)
    reason: str        # the rule in words, with NCCL's source

    def describe(self) -> str:
        """The rule and its reason, as a report states what demanded (or skipped) the flush."""
        return f"{self.rule}: {self.reason}"


def _since(version: Version | None, since: Version) -> bool:
    return (version or MODELLED) >= since


def _name(version: Version | None) -> str:
    return "NCCL " + ".".join(map(str, version)) if version else "NCCL"


def flush_qp_enabled(peermem: bool, nic_dmabuf: bool, environ: Mapping[str, str],
                     version: Version | None = None) -> NcclFlush | None:
    """None where the IB transport sets up its flush QP (connect.cc flushEnabled); else why
    it never flushes."""
    name = _name(version)
    if params.GDR_FLUSH_DISABLE.number(environ) != 0:
        return NcclFlush(False, False, DISABLED, (
            f"NCCL_GDR_FLUSH_DISABLE={params.GDR_FLUSH_DISABLE.raw(environ)}: {name}'s IB transport "
            "never flushes (net_ib connect.cc flushEnabled), whatever would demand it"))
    dmabuf_counts = nic_dmabuf and _since(version, FLUSH_ON_DMABUF_SINCE)
    if peermem or dmabuf_counts:
        return None
    return NcclFlush(False, False, NO_FLUSH_QP, (
        f"{name}'s IB transport enables its flush only where peer memory is loaded "
        "(net_ib flushEnabled; DMA-BUF on the NIC counts from 2.18.3)"))


def nccl_flush(*, gdr_receive: bool, capability: int | None, gpu_c2c: bool,
               nic_path_type: str | None, data_direct: bool, peermem: bool, nic_dmabuf: bool,
               environ: Mapping[str, str], version: Version | None = None) -> NcclFlush:
    """NCCL's flush for a GPU's receives (see the module's docstring).

    gdr_receive: NCCL receives into this GPU's memory through GPUDirect RDMA (gdr_write);
    capability: compute capability x 10 (None: unknown); gpu_c2c: the GPU reaches its CPU over
    C2C; nic_path_type: NCCL's path type from the GPU to its NIC; data_direct: NCCL's network
    device for it is a data-direct one (``<dev>_dma``); peermem: a peer-memory module NCCL
    sees; nic_dmabuf: NCCL's DMA-BUF probe of the NIC passed; environ: the environment as NCCL
    sees it; version: the NCCL the job loads (None: MODELLED's rules)."""
    name = _name(version)
    if not gdr_receive:
        return NcclFlush(False, False, NO_GDR, (
            f"{name} does not receive into this GPU's memory directly, so it has nothing "
            "to flush (net.cc: the flush follows useGdr)"))
    disabled = flush_qp_enabled(peermem, nic_dmabuf, environ, version)
    if disabled is not None:
        return disabled
    if not _since(version, NEED_FLUSH_SINCE):
        return NcclFlush(True, False, EVERY_RECEIVE, (
            f"{name} flushes every GPUDirect receive (net.cc recvProxyProgress; "
            "ncclTopoNeedFlush comes in 2.15.1)"))
    return _need_flush(capability, gpu_c2c, nic_path_type, data_direct, environ, version)


def _need_flush(capability: int | None, gpu_c2c: bool, nic_path_type: str | None,
                data_direct: bool, environ: Mapping[str, str],
                version: Version | None) -> NcclFlush:
    """paths.cc ncclTopoNeedFlush, as the release in use has it."""
    name = _name(version)
    if data_direct and _since(version, DATA_DIRECT_FLUSH_SINCE) and not _since(version, DATA_DIRECT_FORCE_FLUSH_UNTIL):
        return NcclFlush(True, True, DATA_DIRECT, (
            f"{name} flushes every receive through a data-direct NIC: its control path is "
            "C2C and its data path PCIe (net_ib init.cc forceFlush; paths.cc "
            "ncclTopoNeedFlush)"))
    forced = _forced_by_env(environ, version)
    if forced is not None and params.int_value(params.NET_FORCE_FLUSH.raw(environ) or "") is not None:
        return forced   # set, it acts before the GPU's architecture is looked at
    if capability is None:
        return NcclFlush(True, False, UNKNOWN_GPU, (
            "the GPU's compute capability is unknown: flushed, as NCCL flushes on every GPU "
            "before sm90 (paths.cc ncclTopoNeedFlush)"))
    if capability < HOPPER:
        return NcclFlush(True, False, PRE_HOPPER, (
            f"sm{capability}: {name} flushes every GPUDirect receive on GPUs before sm90 "
            "(paths.cc ncclTopoNeedFlush: \"Flush is required on Ampere and earlier\")"))
    if forced is not None:
        return forced
    if gpu_c2c and _pcie_near(nic_path_type) and _since(version, C2C_FLUSH_SINCE):
        return NcclFlush(True, True, C2C, (
            f"the GPU reaches its CPU over C2C and its NIC over PCIe ({nic_path_type}): {name} "
            "flushes every receive, completions and data taking different paths (paths.cc "
            "ncclTopoNeedFlush)"))
    return NcclFlush(False, False, ORDERED, (
        f"sm{capability}: {name} does not flush receives on sm90 and later unless the NIC is "
        "data-direct or C2C is in the way (paths.cc ncclTopoNeedFlush)"))


def _forced_by_env(environ: Mapping[str, str], version: Version | None) -> NcclFlush | None:
    """NCCL_NET_FORCE_FLUSH as the release reads it (default 1 before 2.19.1, then 0)."""
    default = params.NET_FORCE_FLUSH.default(version or MODELLED)
    value = params.int_value(params.NET_FORCE_FLUSH.raw(environ) or "")
    if (default if value is None else value) == 0:
        return None
    setting = str(value) if value is not None else f"{default} (its default before 2.19.1)"
    return NcclFlush(True, True, FORCED_BY_ENV, (
        f"NCCL_NET_FORCE_FLUSH={setting}: {_name(version)} flushes every GPUDirect receive "
        "(paths.cc ncclTopoNeedFlush)"))


def _pcie_near(path_type: str | None) -> bool:
    return path_type in PATH_RANK and PATH_RANK[path_type] <= PATH_RANK[NEAREST_PCIE_PATH]


def unknown_decision() -> NcclFlush:
    """Where NCCL's decision for the GPU is not known (no topology, no NCCL facts): flushed,
    as NCCL flushes on every GPU before sm90 and wherever it forces it. Skipping a flush NCCL
    makes can show stale bytes and call a healthy path broken; a flush NCCL skips costs time
    outside the measured window only."""
    return NcclFlush(True, False, UNKNOWN_DECISION, (
        "NCCL's decision for this GPU is unknown: flushed, as NCCL flushes every GPUDirect "
        "receive on GPUs before sm90 and wherever it forces it (paths.cc ncclTopoNeedFlush)"))


def data_direct_net(net: str | None) -> bool:
    """Whether NCCL's network device is a data-direct one: NCCL names it ``<dev>_dma``
    (net_ib init.cc), and a fused device takes its properties from its first member
    (ncclIbGetProperties)."""
    return bool(net) and net.split("+")[0].split(":")[0].endswith("_dma")


def gpu_flush(decision: NcclGpuDecision, facts: NodeFacts, environ: Mapping[str, str],
              version: Version | None, receives: bool) -> NcclFlush:
    """NCCL's flush for one GPU of the doctor's decision; receives: NCCL receives into it
    through GPUDirect RDMA (its decision's gdr_write, and an RDMA transport at all)."""
    gpu, nic, support = facts.gpu(decision.gpu_bdf), decision.nic, facts.gdr_support
    return nccl_flush(
        gdr_receive=receives, capability=gpu.capability, gpu_c2c=bool(gpu.c2c_links),
        nic_path_type=decision.path_type, data_direct=data_direct_net(decision.net),
        peermem=support.peermem_file is not None,
        nic_dmabuf=nic is not None and support.rules.dmabuf and support.nic_half(nic).supported,
        environ=environ, version=version)
