"""Which of NCCL's rules a given NCCL release follows. The decision (:mod:`gdrprobe.nccl.decision`)
is NCCL 2.30.7's; where an older NCCL decides differently in a way that changes what the
doctor answers, the difference is named here with the first NVIDIA/nccl release tag whose
source has the newer rule (the file and function are in each property's comment):

- DMA-BUF registration: from 2.13.4 (``src/transport/net_ib.cc`` ncclIbDmaBufSupport,
  ``src/init.cc`` dmaBufSupported); before, peer memory only.
- peer memory: NCCL reads ``/sys/module/nvidia_peermem/version`` from 2.23.4
  (``net_ib.cc`` ncclIbGdrSupport); before, only ``/sys/kernel/mm/memory_peers/nv_mem*``,
  which kernels 6.6+ no longer have.
- PXN: from 2.12.7 (``src/graph/paths.cc`` ncclTopoComputePaths, NCCL_PXN_DISABLE);
  NCCL_PXN_C2C from 2.27.3, default 0, then 1 from 2.28.3.
- GDR to a NIC behind a C2C-attached CPU (Grace): none before 2.26.2; NCCL_NET_GDR_C2C,
  default 0, in 2.26.2 (``paths.cc`` ncclTopoCheckGdr); default 1 and the P2C path type
  from 2.27.3; NCCL_NET_GDR_LEVEL's default P2C (PXB before) from 2.29.2.
- NIC fusion: ports and PCI functions of one card merged into one virtual NIC at
  NCCL_NET_MERGE_LEVEL's default PORT, from 2.24.3 (``src/graph/topo.cc``
  ncclTopoAutoMerge).
- Broadcom switches flattened: Gen4 switches whose sub-switch has the same device id from
  2.9.6 (``topo.cc`` ncclTopoFlattenBcmSwitches), Gen4 and Gen5 by getBcmGen from 2.20.3.
- NCCL_CUMEM_ENABLE: from 2.18.1, default 0; from 2.19.1 default -2 (on where the driver
  supports cuMem: ``src/misc/cudawrap.cc`` ncclCuMemEnable). Information only: the
  doctor's decision does not depend on it.
- NCCL_NETDEVS_POLICY and the channel spread it sets: from 2.28.3 (``topo.cc``
  ncclTopoGetLocalNetType); an older NCCL spreads channels over NICs differently, which
  the decision does not model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from gdrprobe.nccl.env import GdrLevel, gdr_level, int_param

Version = tuple[int, int, int]
MODELLED: Version = (2, 30, 7)

DMABUF_SINCE: Version = (2, 13, 4)
PEERMEM_MODULE_FILE_SINCE: Version = (2, 23, 4)
PXN_SINCE: Version = (2, 12, 7)
PXN_C2C_SINCE: Version = (2, 27, 3)
PXN_C2C_ON_SINCE: Version = (2, 28, 3)
GDR_C2C_SINCE: Version = (2, 26, 2)
P2C_SINCE: Version = (2, 27, 3)
P2C_LEVEL_SINCE: Version = (2, 29, 2)
NIC_FUSION_SINCE: Version = (2, 24, 3)
BCM_FLATTEN_SINCE: Version = (2, 9, 6)
BCM_GEN5_SINCE: Version = (2, 20, 3)
CUMEM_SINCE: Version = (2, 18, 1)
CUMEM_AUTO_SINCE: Version = (2, 19, 1)
NETDEVS_POLICY_SINCE: Version = (2, 28, 3)

MEMORY_PEERS_FILES = ("/sys/kernel/mm/memory_peers/nv_mem/version",
                      "/sys/kernel/mm/memory_peers/nv_mem_nc/version")
PEERMEM_MODULE_FILE = "/sys/module/nvidia_peermem/version"
PEERMEM_FILES = MEMORY_PEERS_FILES + (PEERMEM_MODULE_FILE,)    # all three: 2.23.4 on
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str | None) -> Version | None:
    """The first ``major.minor.patch`` in ``text`` ("2.21.5+cuda12.4" -> (2, 21, 5))."""
    match = _VERSION.search(text or "")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def dotted(version: Version) -> str:
    return ".".join(str(part) for part in version)


@dataclasses.dataclass(frozen=True)
class NcclRules:
    """The rules of one NCCL release; ``version`` None: unknown, 2.30.7's rules assumed."""

    version: Version | None = None

    @property
    def effective(self) -> Version:
        return self.version or MODELLED

    def since(self, version: Version) -> bool:
        return self.effective >= version

    @property
    def name(self) -> str:
        return f"NCCL {dotted(self.version)}" if self.version else "NCCL"

    @property
    def dmabuf(self) -> bool:
        return self.since(DMABUF_SINCE)

    @property
    def peermem_files(self) -> tuple[str, ...]:
        """The files whose presence means peer memory to NCCL (net_ib.cc ncclIbGdrSupport)."""
        return PEERMEM_FILES if self.since(PEERMEM_MODULE_FILE_SINCE) else MEMORY_PEERS_FILES

    @property
    def pxn(self) -> bool:
        return self.since(PXN_SINCE)

    def pxn_level(self, environ: Mapping[str, str]) -> str:
        """How near its NIC a PXN relay must be (paths.cc ncclTopoComputePaths, NCCL_PXN_C2C)."""
        if not self.since(PXN_C2C_SINCE):
            return "PXB"
        default = 1 if self.since(PXN_C2C_ON_SINCE) else 0
        return "P2C" if int_param(environ, "NCCL_PXN_C2C", default) else "PXB"

    @property
    def p2c_path(self) -> bool:
        """Whether NCCL marks a C2C GPU's path to its CPU's NICs P2C (paths.cc mergePathType)."""
        return self.since(P2C_SINCE)

    def gdr_c2c(self, environ: Mapping[str, str]) -> bool:
        """NCCL_NET_GDR_C2C as this release reads it (paths.cc ncclTopoCheckGdr)."""
        if not self.since(GDR_C2C_SINCE):
            return False
        return bool(int_param(environ, "NCCL_NET_GDR_C2C", 1 if self.since(P2C_SINCE) else 0))

    def default_gdr_level(self, environ: Mapping[str, str]) -> str:
        """NCCL_NET_GDR_LEVEL's default: P2C while NCCL_NET_GDR_C2C is on from 2.29.2, else PXB."""
        return "P2C" if self.since(P2C_LEVEL_SINCE) and self.gdr_c2c(environ) else "PXB"

    def gdr_level(self, environ: Mapping[str, str]) -> GdrLevel:
        """NCCL_NET_GDR_LEVEL as this release reads it, against its own default."""
        return gdr_level(environ, self.default_gdr_level(environ))

    def gdr_distance(self, distance: str, gpu_c2c: bool, environ: Mapping[str, str]) -> str:
        """The distance ncclTopoCheckGdr compares with the level: in 2.26 a C2C GPU's PHB
        path, in 2.27 and 2.28 a P2C path, counts as C2C while NCCL_NET_GDR_C2C is on; from
        2.29.2 P2C is compared as it is, against the P2C default level."""
        if self.since(P2C_LEVEL_SINCE) or not self.gdr_c2c(environ):
            return distance
        c2c_kind = "P2C" if self.since(P2C_SINCE) else "PHB"
        return "C2C" if gpu_c2c and distance == c2c_kind else distance

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

    def differences(self) -> tuple[str, ...]:
        """What this release does differently from 2.30.7, in the rules the doctor applies."""
        # (since, what differs before it, the rule that must be there for this one to say more)
        checks = (
            (DMABUF_SINCE, "no DMA-BUF registration: GPU memory reaches the NIC through peer memory only", None),
            (PEERMEM_MODULE_FILE_SINCE, "peer memory counts only through /sys/kernel/mm/memory_peers/nv_mem*, "
                                        "not /sys/module/nvidia_peermem/version (absent on kernels 6.6+)", None),
            (PXN_SINCE, "no PXN: a GPU never relays through an NVLink peer to that peer's NIC", None),
            (GDR_C2C_SINCE, "no GPUDirect RDMA to NICs behind a C2C-attached CPU", None),
            (P2C_SINCE, "NCCL_NET_GDR_C2C defaults to 0: no GPUDirect RDMA to NICs behind a C2C-attached CPU "
                        "unless it is set to 1", GDR_C2C_SINCE),
            (P2C_LEVEL_SINCE, "NCCL_NET_GDR_LEVEL defaults to PXB", None),
            (NIC_FUSION_SINCE, "no NIC fusion: each port is its own network device", None),
            (BCM_FLATTEN_SINCE, "no Broadcom switch is flattened", None),
            (BCM_GEN5_SINCE, "Broadcom Gen5 switches are not flattened", BCM_FLATTEN_SINCE),
            (NETDEVS_POLICY_SINCE, "channels spread over NICs by an older rule the doctor does not model", None),
        )
        return tuple(f"{what} (changed in {dotted(since)})" for since, what, needs in checks
                     if not self.since(since) and (needs is None or self.since(needs)))
