"""Which of NCCL's rules a given NCCL release follows. The decision (:mod:`gdrprobe.nccl.decision`)
is NCCL 2.31's, read from NVIDIA/nccl's dev branch at 2.31.0a7 (the newest source in reach;
2.30.7 is its last tag); where an older NCCL decides differently in a way that changes what
the doctor or the check answers, the difference is named here with the first NVIDIA/nccl
release tag whose source has the newer rule (the file and function are in each property's
comment). What a newer release changes that no source read here shows is said, not
modelled (:meth:`NcclRules.unmodelled`: 2.32's ConnectX-9 rail and plane detection).

- DMA-BUF registration: from 2.13.4 (``src/transport/net_ib.cc`` ncclIbDmaBufSupport,
  ``src/init.cc`` dmaBufSupported); before, peer memory only. In 2.13.x ``src/transport/net.cc``
  registers device buffers through DMA-BUF whenever the communicator's GPU supports it
  (``comm->dmaBufSupport``); from 2.14.3 only where the NIC does too (useDmaBuf:
  ``props.ptrSupport & NCCL_PTR_DMABUF``).
- peer memory: NCCL reads ``/sys/module/nvidia_peermem/version`` from 2.23.4
  (``net_ib.cc`` ncclIbGdrSupport); before, only ``/sys/kernel/mm/memory_peers/nv_mem*``,
  which kernels 6.6+ no longer have.
- PXN: from 2.12.7 (``src/graph/paths.cc`` ncclTopoComputePaths, NCCL_PXN_DISABLE). Until
  2.13.x only for a GPU whose own path is beyond PXB; from 2.14.3 also for a relay with more
  bandwidth; the relay is ncclTopoGetLocalGpu's from 2.18.1 (before, the first NVLink peer
  near the NIC, preferably one whose own NIC it is: not modelled); the own path counts as
  "through the CPU" beyond PXB until 2.27.5 (beyond NCCL_PXN_C2C's type in 2.27.5), beyond
  PXN from 2.27.6; the relay must have GDR to the NIC (ncclTopoCheckGdr, read) from 2.30.3.
  NCCL_PXN_C2C from 2.27.3, default 0, then 1 from 2.28.3.
- Path types: 2.27.3 numbers PXN before P2C (``src/graph/topo.h``: PATH_PXN 6, PATH_P2C 7);
  from 2.27.5 P2C is 6 and PXN 7. So in 2.27.3 a PXN path beats a P2C one of equal
  bandwidth (ncclTopoGetLocal takes the lowest type) and NCCL_NET_GDR_LEVEL=PXN does not
  admit P2C.
- GDR to a NIC behind a C2C-attached CPU (Grace): none before 2.26.2; NCCL_NET_GDR_C2C,
  default 0, in 2.26.2 (``paths.cc`` ncclTopoCheckGdr); default 1 and the P2C path type
  from 2.27.3 (every NIC of the GPU's CPU), only the GPU's local NICs from 2.29.2;
  NCCL_NET_GDR_LEVEL's default P2C (PXB before) from 2.29.2.
- NCCL_NET_GDR_READ's default (-2) keeps sends off GPUDirect for a GPU without an NVLink
  peer (unless it is the communicator's only GPU): every GPU before 2.19.1, only GPUs before
  sm80 from 2.19.1 (``paths.cc`` ncclTopoCheckGdr).
- MLO partitions (a CUDA device named "... MLOPart<n>", ``src/init.cc`` fillInfo): no GDR
  unless NCCL_NET_GDR_MLOPART is set non-zero, from 2.30.7 (``paths.cc`` ncclTopoCheckGdr).
- NIC fusion: ports and PCI functions of one card merged into one virtual NIC at
  NCCL_NET_MERGE_LEVEL's default PORT, from 2.24.3 (``src/graph/topo.cc``
  ncclTopoAutoMerge).
- Broadcom switches flattened: Gen4 switches whose sub-switch has the same device id from
  2.9.6 (``topo.cc`` ncclTopoFlattenBcmSwitches), Gen4 and Gen5 by getBcmGen from 2.20.3.
- NCCL_CUMEM_ENABLE (``src/misc/cudawrap.cc`` ncclCuMemEnable): from 2.18.1, default 0 and
  any non-zero value on; from 2.19.1 default -2 (on where the driver supports cuMem), a
  value >= 0 as it is, any other negative off. Before 2.18.1 NCCL allocates with cudaMalloc.
- NCCL_IB_PCI_RELAXED_ORDERING: from 2.12.7 (``net_ib.cc`` ncclIbRelaxedOrderingCapable);
  before, no registration asks for relaxed ordering.
- NCCL_NET: matched case-insensitively from 2.13.4 (``src/net.cc``, later
  ``src/plugin/net.cc`` ncclNetInit: strcasecmp), exactly before (strcmp).
- mlx5 data-direct devices (``<dev>_dma``, NCCL_IB_DATA_DIRECT): from 2.27.3, exposed beside
  the device; from 2.27.6 instead of it by default; from 2.28.3 a lookup error other than
  ENODEV stops the IB transport (:mod:`gdrprobe.nccl.data_direct`).
- NCCL_NETDEVS_POLICY and the channel spread it sets: from 2.28.3 (``topo.cc``
  ncclTopoGetLocalNetType); an older NCCL spreads channels over NICs differently, which
  the decision does not model.
- 2.31: what is at an NVLink's far end, asked of NVML first (``src/graph/xml.cc``
  ncclTopoGetXmlFromGpu, nvmlDeviceGetNvLinkRemoteDeviceType: a driver without it shows no
  NVLink); the inter-CPU link of AMD CPUs by Zen generation and of Intel's Granite Rapids and
  Sierra Forest as Emerald Rapids (``topo.cc`` ncclTopoAddCpu, ncclTopoGetInterCpuBw); a
  data-direct NIC no longer forces the flush (``net_ib/init.cc`` ncclIbGetPhysProperties);
  the receive channel line says NCCL's flush (``net.cc`` recvSetup: "/flush=...").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.env import GdrLevel, gdr_level, gpu_allocation, relaxed_ordering_wanted
from gdrprobe.nccl.topo import PATH_RANK

Version = params.Version
MODELLED: Version = params.LATEST   # the newest source read: the dev branch at 2.31.0a7
# Releases whose source is not in reach, what their release notes say they change in what
# the doctor decides, and the rules it applies instead.
UNREAD_RELEASES: tuple[tuple[Version, str], ...] = (
    ((2, 32, 0), "2.32 adds ConnectX-9 rail and plane detection (2.32.3's release notes; its source was not "
                 "read): on ConnectX-9 NICs NCCL may fuse them or spread channels over them otherwise than "
                 "the doctor's 2.31 rules say"),)

DMABUF_SINCE: Version = params.DMABUF_ENABLE.since
DMABUF_NIC_PROPERTY_SINCE: Version = (2, 14, 3)
PEERMEM_MODULE_FILE_SINCE: Version = (2, 23, 4)
PXN_SINCE: Version = params.PXN_DISABLE.since
PXN_BY_BANDWIDTH_SINCE: Version = (2, 14, 3)
PXN_LOCAL_GPU_SINCE: Version = (2, 18, 1)
PXN_C2C_SINCE: Version = params.PXN_C2C.since
PXN_OWN_TYPE_C2C_SINCE: Version = (2, 27, 5)
PXN_OWN_TYPE_PXN_SINCE: Version = (2, 27, 6)
PXN_RELAY_GDR_SINCE: Version = (2, 30, 3)
GDR_C2C_SINCE: Version = params.NET_GDR_C2C.since
P2C_SINCE: Version = params.NET_GDR_C2C.first_with(1)      # NCCL_NET_GDR_C2C on by default too
P2C_BEFORE_PXN_SINCE: Version = (2, 27, 5)
P2C_LEVEL_SINCE: Version = params.NET_GDR_LEVEL.first_with("P2C")
P2C_LOCAL_NICS_SINCE: Version = (2, 29, 2)
GDR_READ_PRE_AMPERE_SINCE: Version = (2, 19, 1)
MLOPART_SINCE: Version = params.NET_GDR_MLOPART.since
RELAXED_ORDERING_SINCE: Version = params.IB_PCI_RELAXED_ORDERING.since
NET_NAME_CASELESS_SINCE: Version = (2, 13, 4)
NIC_FUSION_SINCE: Version = (2, 24, 3)
BCM_FLATTEN_SINCE: Version = (2, 9, 6)
BCM_GEN5_SINCE: Version = (2, 20, 3)
CUMEM_SINCE: Version = params.CUMEM_ENABLE.since
CUMEM_AUTO_SINCE: Version = params.CUMEM_ENABLE.first_with(-2)
NETDEVS_POLICY_SINCE: Version = params.NETDEVS_POLICY.since
DATA_DIRECT_SINCE: Version = params.IB_DATA_DIRECT.since
DATA_DIRECT_ALONE_SINCE: Version = (2, 27, 6)           # NCCL_IB_DATA_DIRECT=1: <dev>_dma alone
DATA_DIRECT_LOOKUP_FATAL_SINCE: Version = (2, 28, 3)    # a lookup error stops the IB transport
# GPU-initiated networking (gdrprobe.nccl.gin cites each): src/gin/ from 2.28.7 (2.28.3 has
# none); the GPU-memory gate of its backends and the CUDA VMM GPUDirect attribute from 2.29.7;
# Volta or newer from 2.30.3; no MLO partition from 2.30.7; no GIN with fused NICs in
# 2.29.2-2.30.4 (src/init.cc globalNicFused); GIN on EFA from the aws-ofi-nccl plugin with
# NCCL 2.31.2+ (its doc/gin-getting-started.md).
GIN_SINCE: Version = (2, 28, 7)
GIN_GDR_GATE_SINCE: Version = (2, 29, 7)
GIN_VMM_GATE_SINCE: Version = (2, 29, 7)
GIN_COMPUTE_GATE_SINCE: Version = (2, 30, 3)
GIN_MLO_GATE_SINCE: Version = (2, 30, 7)
GIN_NIC_FUSED_GATE: tuple[Version, Version] = ((2, 29, 2), (2, 30, 7))
GIN_EFA_SINCE: Version = (2, 31, 2)
NVLINK_REMOTE_TYPE_SINCE: Version = (2, 31, 0)
INTER_CPU_BY_GENERATION_SINCE: Version = (2, 31, 0)
DATA_DIRECT_FORCE_FLUSH_UNTIL: Version = (2, 31, 0)   # net_ib init.cc sets forceFlush before it

# src/graph/topo.h in 2.27.3 only: PATH_PXN 6 before PATH_P2C 7 (every other release with
# P2C numbers P2C 6, PXN 7: gdrprobe.nccl.topo.PATH_RANK).
PATH_RANK_2_27_3 = {**PATH_RANK, "PXN": PATH_RANK["P2C"], "P2C": PATH_RANK["PXN"]}
# The transport NCCL_NET names to keep NCCL off RDMA (src/transport/net_socket.cc ncclNetSocket).
SOCKET_TRANSPORT = "Socket"

MEMORY_PEERS_FILES = ("/sys/kernel/mm/memory_peers/nv_mem/version",
                      "/sys/kernel/mm/memory_peers/nv_mem_nc/version")
PEERMEM_MODULE_FILE = "/sys/module/nvidia_peermem/version"
PEERMEM_FILES = MEMORY_PEERS_FILES + (PEERMEM_MODULE_FILE,)    # all three: 2.23.4 on
_VERSION = re.compile(r"(?<![0-9])([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})")


def parse_version(text: str | None) -> Version | None:
    """The first ``major.minor.patch`` in ``text`` ("2.21.5+cuda12.4" -> (2, 21, 5))."""
    match = _VERSION.search(text or "")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def dotted(version: Version) -> str:
    return ".".join(str(part) for part in version)


@dataclasses.dataclass(frozen=True)
class NcclRules:
    """The rules of one NCCL release; ``version`` None: unknown, MODELLED's rules assumed."""

    version: Version | None = None

    @property
    def effective(self) -> Version:
        return self.version or MODELLED

    def since(self, version: Version) -> bool:
        return self.effective >= version

    # Which library's rules these are, as its log lines name it.
    library = "NCCL"
    # The send-side rule of NCCL_NET_GDR_READ's default (read_refusal in nccl/decision.py);
    # RCCL's HIP build compiles it out.
    gdr_read_needs_nvlink = True
    # Where peer memory and DMA-BUF both hold, NCCL registers through DMA-BUF (net.cc
    # useDmaBuf); RCCL from ROCm 7.12 through peer memory (gdrprobe.nccl.rccl).
    prefers_peermem = False

    @property
    def name(self) -> str:
        return f"NCCL {dotted(self.version)}" if self.version else "NCCL"

    @property
    def described(self) -> str:
        """The release whose rules decide, as a reason names it."""
        return self.name if self.version else f"NCCL (version unknown: {dotted(MODELLED)}'s rules)"

    def reads(self, declared: params.Param) -> bool:
        """Whether this release of this library reads the variable at all."""
        return declared.read_by(self.effective, self.library)

    def param(self, declared: params.Param, environ: Mapping[str, str]) -> params.Value:
        """A variable as this release of this library reads it (None: it does not read it)."""
        return declared.value(environ, self)

    @property
    def dmabuf(self) -> bool:
        return self.since(DMABUF_SINCE)

    @property
    def dmabuf_needs_nic(self) -> bool:
        """Whether net.cc registers through DMA-BUF only where the NIC registers DMA-BUF too
        (useDmaBuf's ``props.ptrSupport & NCCL_PTR_DMABUF``, 2.14.3 on); 2.13.x takes it
        whenever the GPU side allows (``comm->dmaBufSupport``), and a NIC that cannot fails."""
        return self.since(DMABUF_NIC_PROPERTY_SINCE)

    @property
    def path_rank(self) -> dict[str, int]:
        """NCCL's path types by the number this release gives them (src/graph/topo.h)."""
        return PATH_RANK_2_27_3 if self.since(P2C_SINCE) and not self.since(P2C_BEFORE_PXN_SINCE) else PATH_RANK

    def selects_socket(self, environ: Mapping[str, str]) -> bool:
        """NCCL_NET names the socket transport: strcasecmp from 2.13.4, strcmp before
        (src/net.cc ncclNetInit; src/plugin/net.cc ncclNetInit from 2.26)."""
        name = params.NET.raw(environ)
        if name is None or not self.since(NET_NAME_CASELESS_SINCE):
            return name == SOCKET_TRANSPORT
        return name.lower() == SOCKET_TRANSPORT.lower()

    def relaxed_ordering(self, environ: Mapping[str, str]) -> bool:
        """Whether NCCL registers memory with IBV_ACCESS_RELAXED_ORDERING (where libibverbs
        has IBVERBS_1.8): NCCL_IB_PCI_RELAXED_ORDERING from 2.12.7, never before."""
        return self.since(RELAXED_ORDERING_SINCE) and relaxed_ordering_wanted(environ)

    def gpu_allocation(self, environ: Mapping[str, str]) -> str:
        """How NCCL allocates its GPU buffers, "vmm" (cuMem) or "malloc" (cudaMalloc), by
        src/misc/cudawrap.cc ncclCuMemEnable: none before 2.18.1; in 2.18
        ``(param == -2 && supported) || param`` with default 0, so any non-zero value is
        on; from 2.19.1 :func:`gdrprobe.nccl.env.gpu_allocation`."""
        if not self.since(CUMEM_SINCE):
            return "malloc"
        if not self.since(CUMEM_AUTO_SINCE):
            return "vmm" if self.param(params.CUMEM_ENABLE, environ) else "malloc"
        return gpu_allocation(environ)

    @property
    def gdr_read_pre_ampere_only(self) -> bool:
        """NCCL_NET_GDR_READ's default turns sends off only before sm80 from 2.19.1; on
        every GPU without an NVLink peer before (paths.cc ncclTopoCheckGdr)."""
        return self.since(GDR_READ_PRE_AMPERE_SINCE)

    def mlo_part_gdr(self, environ: Mapping[str, str]) -> bool:
        """Whether an MLO partition may use GDR: NCCL_NET_GDR_MLOPART (default 0) from 2.30.7
        (paths.cc ncclTopoCheckGdr); an older NCCL has no notion of partitions."""
        return not self.since(MLOPART_SINCE) or self.param(params.NET_GDR_MLOPART, environ) != 0

    @property
    def peermem_files(self) -> tuple[str, ...]:
        """The files whose presence means peer memory to NCCL (net_ib.cc ncclIbGdrSupport)."""
        return PEERMEM_FILES if self.since(PEERMEM_MODULE_FILE_SINCE) else MEMORY_PEERS_FILES

    @property
    def pxn(self) -> bool:
        return self.since(PXN_SINCE)

    @property
    def pxn_relay_needs_gdr(self) -> bool:
        """The relay GPU must have GDR (read) to the NIC: from 2.30.3 (paths.cc
        ncclTopoComputePaths calls ncclTopoCheckGdr on the peer); 2.12.7-2.29.7 do not ask."""
        return self.since(PXN_RELAY_GDR_SINCE)

    @property
    def pxn_by_bandwidth(self) -> bool:
        """A GPU whose own path is within PXB still relays to a peer with more bandwidth
        from 2.14.3; before, PXN is tried only where the own path is beyond PXB."""
        return self.since(PXN_BY_BANDWIDTH_SINCE)

    def pxn_own_limit(self, environ: Mapping[str, str]) -> str:
        """The own path type beyond which a relay is taken whatever the bandwidth (paths.cc
        ncclTopoComputePaths, condition (4)): PXB until 2.27.5, NCCL_PXN_C2C's type in 2.27.5,
        PXN from 2.27.6."""
        if self.since(PXN_OWN_TYPE_PXN_SINCE):
            return "PXN"
        return self.pxn_level(environ) if self.since(PXN_OWN_TYPE_C2C_SINCE) else "PXB"

    def pxn_level(self, environ: Mapping[str, str]) -> str:
        """How near its NIC a PXN relay must be (paths.cc ncclTopoComputePaths, NCCL_PXN_C2C)."""
        if not self.since(PXN_C2C_SINCE):
            return "PXB"
        return "P2C" if self.param(params.PXN_C2C, environ) else "PXB"

    @property
    def p2c_path(self) -> bool:
        """Whether NCCL marks a C2C GPU's path to its CPU's NICs P2C (paths.cc mergePathType)."""
        return self.since(P2C_SINCE)

    @property
    def p2c_local_nics_only(self) -> bool:
        """P2C only to the GPU's local NICs (ncclTopoGetLocal) from 2.29.2; to every NIC of
        its CPU in 2.27.3-2.29.1 (paths.cc ncclTopoComputePaths)."""
        return self.since(P2C_LOCAL_NICS_SINCE)

    def gdr_c2c(self, environ: Mapping[str, str]) -> bool:
        """NCCL_NET_GDR_C2C as this release reads it (paths.cc ncclTopoCheckGdr)."""
        return bool(self.param(params.NET_GDR_C2C, environ))

    def default_gdr_level(self, environ: Mapping[str, str]) -> str:
        """NCCL_NET_GDR_LEVEL's default: P2C while NCCL_NET_GDR_C2C is on from 2.29.2, else PXB."""
        return "P2C" if self.since(P2C_LEVEL_SINCE) and self.gdr_c2c(environ) else "PXB"

    def gdr_level(self, environ: Mapping[str, str]) -> GdrLevel:
        """NCCL_NET_GDR_LEVEL as this release reads it, against its own default and path numbers."""
        return gdr_level(environ, self.default_gdr_level(environ), self.path_rank)

    def nearest_gdr_distances(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        """The nearest distances ncclTopoCheckGdr can compare for any GPU and NIC: PIX, and
        C2C where this release counts a C2C GPU's path to its CPU's NIC as C2C
        (:meth:`gdr_distance`). A GDR level below all of them turns GDR off whatever the
        topology."""
        counted = {self.gdr_distance(kind, True, environ) for kind in ("PHB", "P2C")}
        return ("PIX",) + (("C2C",) if "C2C" in counted else ())

    def gdr_distance(self, distance: str, gpu_c2c: bool, environ: Mapping[str, str]) -> str:
        """The distance ncclTopoCheckGdr compares with the level: in 2.26 a C2C GPU's PHB
        path, in 2.27 and 2.28 a P2C path, counts as C2C while NCCL_NET_GDR_C2C is on; from
        2.29.2 P2C is compared as it is, against the P2C default level."""
        if self.since(P2C_LEVEL_SINCE) or not self.gdr_c2c(environ):
            return distance
        c2c_kind = "P2C" if self.since(P2C_SINCE) else "PHB"
        return "C2C" if gpu_c2c and distance == c2c_kind else distance

    @property
    def nvlink_remote_type(self) -> bool:
        """Whether NCCL asks NVML what is at an NVLink's far end before its bus id
        (nvmlDeviceGetNvLinkRemoteDeviceType: a switch, a GPU; src/graph/xml.cc
        ncclTopoGetXmlFromGpu, 2.31): a driver without that entry point then shows NCCL no
        NVLink. Before, the far end's bus id alone (an empty one: an NVSwitch)."""
        return self.since(NVLINK_REMOTE_TYPE_SINCE)

    @property
    def inter_cpu_by_generation(self) -> bool:
        """The inter-CPU bandwidth of AMD by Zen generation, and of Intel's Granite Rapids and
        Sierra Forest as Emerald Rapids (src/graph/topo.cc ncclTopoGetInterCpuBw, 2.31);
        before, every AMD CPU 16 GB/s and those Intel CPUs as Sapphire Rapids."""
        return self.since(INTER_CPU_BY_GENERATION_SINCE)

    @property
    def nic_fusion(self) -> bool:
        return self.since(NIC_FUSION_SINCE)

    @property
    def bcm_flatten(self) -> str | None:
        """How ncclTopoFlattenBcmSwitches matches (:class:`gdrprobe.nccl.topo.NcclPciTree`)."""
        if self.since(BCM_GEN5_SINCE):
            return "masked"
        return "exact" if self.since(BCM_FLATTEN_SINCE) else None

    @property
    def cumem_default(self) -> str:
        if self.since(CUMEM_AUTO_SINCE):
            return "NCCL_CUMEM_ENABLE defaults to on where the driver supports cuMem (since 2.19.1)"
        if self.since(CUMEM_SINCE):
            return "NCCL_CUMEM_ENABLE defaults to 0 (2.18)"
        return "no cuMem allocations (before 2.18.1)"

    def unmodelled(self) -> tuple[str, ...]:
        """What this release changes, by its release notes, that the doctor's rules (read from
        source up to MODELLED) do not follow."""
        return tuple(note for since, note in UNREAD_RELEASES if self.version and self.version >= since)

    def differences(self) -> tuple[str, ...]:
        """What this release does differently from MODELLED, in the rules the doctor applies."""
        # (since, what differs before it, the rule that must be there for this one to say more)
        checks = (
            (DMABUF_SINCE, "no DMA-BUF registration: GPU memory reaches the NIC through peer memory only", None),
            (DMABUF_NIC_PROPERTY_SINCE, "GPU memory is registered through DMA-BUF wherever the GPU can export it, "
                                        "also with a NIC that cannot register DMA-BUF (those registrations fail)",
             DMABUF_SINCE),
            (PEERMEM_MODULE_FILE_SINCE, "peer memory counts only through /sys/kernel/mm/memory_peers/nv_mem*, "
                                        "not /sys/module/nvidia_peermem/version (absent on kernels 6.6+)", None),
            (PXN_SINCE, "no PXN: a GPU never relays through an NVLink peer to that peer's NIC", None),
            (PXN_BY_BANDWIDTH_SINCE, "PXN only for a GPU whose own path to the NIC is beyond PXB", PXN_SINCE),
            (PXN_LOCAL_GPU_SINCE, "PXN relays through the first NVLink peer near the NIC, preferably one whose own "
                                  "NIC it is (the doctor applies 2.18.1's choice, ncclTopoGetLocalGpu)", PXN_SINCE),
            (PXN_RELAY_GDR_SINCE, "PXN relays through an NVLink peer even where that peer has no GPUDirect RDMA to "
                                  "the NIC", PXN_SINCE),
            (GDR_C2C_SINCE, "no GPUDirect RDMA to NICs behind a C2C-attached CPU", None),
            (P2C_SINCE, "NCCL_NET_GDR_C2C defaults to 0: no GPUDirect RDMA to NICs behind a C2C-attached CPU "
                        "unless it is set to 1", GDR_C2C_SINCE),
            (P2C_BEFORE_PXN_SINCE, "path type PXN is numbered before P2C: PXN wins over P2C at equal bandwidth, and "
                                   "NCCL_NET_GDR_LEVEL=PXN does not admit P2C", P2C_SINCE),
            (PXN_OWN_TYPE_PXN_SINCE, "a GPU whose own path to the NIC is P2C still relays through an NVLink peer",
             P2C_SINCE),
            (P2C_LEVEL_SINCE, "NCCL_NET_GDR_LEVEL defaults to PXB", None),
            (P2C_LOCAL_NICS_SINCE, "P2C to every NIC of a C2C GPU's CPU, not only to its nearest", P2C_SINCE),
            (GDR_READ_PRE_AMPERE_SINCE, "NCCL_NET_GDR_READ's default keeps sends off GPUDirect RDMA on every GPU "
                                        "without an NVLink peer, not only before sm80", None),
            (MLOPART_SINCE, "MLO partitions use GPUDirect RDMA like whole GPUs (no NCCL_NET_GDR_MLOPART)", None),
            (RELAXED_ORDERING_SINCE, "no PCIe relaxed ordering in memory registrations "
                                     "(no NCCL_IB_PCI_RELAXED_ORDERING)", None),
            (NET_NAME_CASELESS_SINCE, "NCCL_NET is matched case-sensitively (Socket, IB)", None),
            (NIC_FUSION_SINCE, "no NIC fusion: each port is its own network device", None),
            (BCM_FLATTEN_SINCE, "no Broadcom switch is flattened", None),
            (BCM_GEN5_SINCE, "Broadcom Gen5 switches are not flattened", BCM_FLATTEN_SINCE),
            (DATA_DIRECT_SINCE, "no mlx5 data-direct devices (<dev>_dma): NCCL_IB_DATA_DIRECT is ignored", None),
            (DATA_DIRECT_ALONE_SINCE, "a data-direct NIC is opened twice by default, as itself and as <dev>_dma",
             DATA_DIRECT_SINCE),
            (DATA_DIRECT_LOOKUP_FATAL_SINCE, "a data-direct lookup error (not ENODEV) counts as no data-direct "
                                             "device instead of stopping the IB transport", DATA_DIRECT_SINCE),
            (NETDEVS_POLICY_SINCE, "channels spread over NICs by an older rule the doctor does not model", None),
            (NVLINK_REMOTE_TYPE_SINCE, "NVLink's far end by its bus id alone (an empty one an NVSwitch), not by "
                                       "NVML's device type", None),
            (INTER_CPU_BY_GENERATION_SINCE, "every AMD CPU's inter-socket link 16 GB/s, and Intel's Granite Rapids "
                                            "and Sierra Forest rated as Sapphire Rapids", None),
            (DATA_DIRECT_FORCE_FLUSH_UNTIL, "a data-direct NIC's receives are always flushed (forceFlush)",
             DATA_DIRECT_SINCE),
        )
        return tuple(f"{what} (changed in {dotted(since)})" for since, what, needs in checks
                     if not self.since(since) and (needs is None or self.since(needs)))
