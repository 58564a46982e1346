"""For every GPU: the NIC NCCL will use, through which path, and whether with GPUDirect RDMA
for receives (the NIC writes GPU memory) and sends (the NIC reads it), decided by NCCL's
own rules (NVIDIA/nccl 2.30.7):

1. Path type and bandwidth of each GPU-NIC pair (``src/graph/paths.cc`` ncclTopoSetPaths):
   the worst hop (PIX, PXB, PHB, SYS; NODE is PHB); bandwidth is the narrowest link: each
   PCIe link (:func:`gdrprobe.doctor.pci.link_bandwidth_gbs`), the NIC's port speed / 8
   (``src/graph/topo.cc`` ncclTopoAddNet) and, across sockets, the inter-CPU link
   (``src/graph/topo.h``: Intel 10 GB/s as Skylake, AMD 16, others 6).
2. P2C (ncclTopoComputePaths, mergePathType): a GPU that reaches its CPU over C2C (Grace;
   NVML's C2C link count) gets P2C to the NICs of that CPU that are local to it.
3. PXN (ncclTopoComputePaths, "Update paths for NICs"): unless NCCL_PXN_DISABLE=1, a GPU
   reaches a NIC through the NVLink peer whose own NIC it is, when that peer is at most P2C
   from it (PXB with NCCL_PXN_C2C=0) with GDR, and the peer has more bandwidth to it or our
   own path is PHB or SYS.
4. The NIC (ncclTopoGetLocal / ncclTopoGetLocalNetType): the NICs with the highest
   bandwidth, then the lowest path type; among those, channel 0 takes
   ``dev % localGpuCount`` (bits mirrored when the NIC count is a power of two).
5. GDR (ncclTopoCheckGdr): the NIC must support it (:mod:`gdrprobe.doctor.memory_path`),
   the GPU too; for sends, NCCL_NET_GDR_READ=0 turns it off, and its default turns it off
   on GPUs before sm80 that have no NVLink peer (unless they are the only GPU); then the
   path type (the proxy GPU's, for PXN) must not exceed the GDR level.

NVLink and C2C come from NVML; without it there is neither PXN nor P2C to see, and the
decision says so.
"""

from __future__ import annotations

import dataclasses
import functools
from gdrprobe.doctor import nvml, pci
from gdrprobe.doctor.topology import Endpoint, pcie_distance
from gdrprobe.nccl.env import NCCL_CLASS_OF_DISTANCE, PATH_RANK, gdr_level, int_param, parse_hca_filter
from gdrprobe.report.model import NcclGpuDecision

NVLINK_GBS_PER_LINK = ((100, 40.1), (90, 20.6), (87, 20.0), (86, 12.0), (80, 20.0), (70, 20.0), (60, 18.0))
INTER_CPU_GBS = {"GenuineIntel": 10.0, "AuthenticAMD": 16.0}
OTHER_CPU_GBS = 6.0
NET_FALLBACK_GBS = 10000 / 8000.0      # ncclTopoAddNet: a NIC without a speed counts as 10 Gb/s
PRE_AMPERE = 80


@dataclasses.dataclass(frozen=True)
class PairPath:
    type: str                      # NCCL path type
    bw: float                      # GB/s
    via: Endpoint | None = None    # the NVLink peer a PXN path relays through


@dataclasses.dataclass(frozen=True)
class Gdr:
    on: bool
    reason: str


class Machine:
    """What the rules read, gathered once: endpoints, links, NVLink, C2C, facts, environment."""

    def __init__(self, ctx, environ=None):
        self.ctx = ctx
        self.environ = ctx.environ if environ is None else environ
        self.gpus = ctx.topology.gpus
        hca = self.environ.get("NCCL_IB_HCA")
        self.hca = parse_hca_filter(hca) if hca else None
        # NCCL drops what NCCL_IB_HCA leaves out before it reads the topology (net_ib/init.cc).
        self.nics = tuple(n for n in ctx.topology.nics if self.hca is None or self.hca.selects(n.name))
        self.paths = ctx.memory_paths
        self.nvml = ctx.nvml_facts if nvml.usable(ctx.nvml_facts) else None
        cuda = ctx.cuda_facts if ctx.cuda_facts and "error" not in ctx.cuda_facts else {}
        self.cuda = {gpu["pci_bus_id"]: gpu for gpu in cuda.get("gpus", [])}
        self.level = gdr_level(self.environ)

    # -- facts ----------------------------------------------------------------------
    @functools.cached_property
    def inter_cpu_gbs(self) -> float:
        cpuinfo = self.ctx.root.read("/proc/cpuinfo") or ""
        vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                       if line.startswith("vendor_id")), "")
        return INTER_CPU_GBS.get(vendor, OTHER_CPU_GBS)

    @functools.lru_cache(maxsize=None)
    def link_gbs(self, bdf: str) -> float:
        return pci.link_bandwidth_gbs(self.ctx.root, bdf)

    @functools.lru_cache(maxsize=None)
    def port_gbs(self, nic: str) -> float:
        rate = pci.port_rate_gbps(self.ctx.root, nic)
        return rate / 8.0 if rate else NET_FALLBACK_GBS

    def capability(self, gpu: Endpoint) -> int | None:
        facts = self.cuda.get(gpu.bdf, {})
        major, minor = facts.get("compute_capability_major"), facts.get("compute_capability_minor")
        return None if major is None else major * 10 + (minor or 0)

    def c2c(self, gpu: Endpoint) -> bool:
        entry = nvml.gpu_entry(self.nvml, gpu.bdf)
        return bool(entry and entry.get("c2c_link_count"))

    def nvlinks(self, gpu: Endpoint) -> list[str]:
        entry = nvml.gpu_entry(self.nvml, gpu.bdf)
        return list(entry.get("nvlink_remote_bus_ids", [])) if entry else []

    def nvlink_count(self, gpu: Endpoint, peer: Endpoint) -> int:
        """Links between two GPUs: direct ones, or, through NVSwitches (far ends that are no
        GPU of this node), the fewer of the two GPUs' switch links."""
        gpu_bdfs = {g.bdf for g in self.gpus}
        direct = self.nvlinks(gpu).count(peer.bdf)
        if direct:
            return direct
        switched = [len([r for r in self.nvlinks(g) if r not in gpu_bdfs]) for g in (gpu, peer)]
        return min(switched)

    def nvlink_gbs(self, gpu: Endpoint, peer: Endpoint) -> float:
        cc = self.capability(gpu) or 90
        per_link = next((bw for floor, bw in NVLINK_GBS_PER_LINK if cc >= floor), 20.0)
        return self.nvlink_count(gpu, peer) * per_link

    # -- step 1 and 2: the direct paths ------------------------------------------------
    @functools.lru_cache(maxsize=None)
    def direct(self, gpu: Endpoint, nic: Endpoint) -> PairPath:
        distance = pcie_distance(gpu, nic)
        kind = NCCL_CLASS_OF_DISTANCE[distance]
        # Over C2C the GPU's own PCIe link is not on the way to the CPU's NICs.
        gpu_link = float("inf") if self.c2c(gpu) and kind != "SYS" else self.link_gbs(gpu.bdf)
        bw = min(gpu_link, self.link_gbs(nic.bdf), self.port_gbs(nic.name))
        if kind == "SYS":
            bw = min(bw, self.inter_cpu_gbs)
        return PairPath(kind, bw)

    def local(self, options: dict) -> list:
        """ncclTopoGetLocal: the highest bandwidth, then the lowest path type, in index order."""
        if not options:
            return []
        best = max(path.bw for path in options.values())
        top = {k: p for k, p in options.items() if p.bw == best}
        lowest = min(PATH_RANK[p.type] for p in top.values())
        return [k for k, p in top.items() if PATH_RANK[p.type] == lowest]

    @functools.cached_property
    def before_pxn(self) -> dict[Endpoint, dict[Endpoint, PairPath]]:
        table = {gpu: {nic: self.direct(gpu, nic) for nic in self.nics} for gpu in self.gpus}
        for gpu in self.gpus:
            if not self.c2c(gpu):
                continue
            for nic in self.local(table[gpu]):
                if table[gpu][nic].type == "PHB" and pcie_distance(gpu, nic) in ("PHB", "NODE"):
                    table[gpu][nic] = dataclasses.replace(table[gpu][nic], type="P2C")
        return table

    def local_gpus(self, nic: Endpoint) -> list[Endpoint]:
        """The NIC's own GPUs (PXN is one-way, GPU to NIC, so the direct paths count)."""
        return self.local({gpu: self.before_pxn[gpu][nic] for gpu in self.gpus})

    def channel_nic(self, gpu: Endpoint, table, channel: int = 0) -> Endpoint | None:
        nets = self.local(table[gpu])
        if not nets:
            return None
        gpus_of_first = max(len(self.local_gpus(nets[0])), 1)
        # NCCL's gpu.dev is the CUDA ordinal; bus order stands in without CUDA facts.
        dev = self.cuda.get(gpu.bdf, {}).get("ordinal", self.gpus.index(gpu))
        index = dev % gpus_of_first
        if len(nets) & (len(nets) - 1) == 0:
            index = mirror_bits(index, len(nets))
        return nets[(index + channel) % len(nets)]

    def local_gpu(self, nic: Endpoint) -> Endpoint | None:
        """ncclTopoGetLocalGpu: the first of the NIC's GPUs that uses it on some channel."""
        for channel in range(max(len(self.nics), 1)):
            for gpu in self.local_gpus(nic):
                if self.channel_nic(gpu, self.before_pxn, channel) == nic:
                    return gpu
        return None

    # -- step 5: the GDR gate -----------------------------------------------------------
    def gdr(self, gpu: Endpoint, nic: Endpoint, path: PairPath, read: bool) -> Gdr:
        if not self.paths.nic_gdr(nic.name, gpu.bdf):
            return Gdr(False, f"NCCL says \"GPU Direct RDMA Disabled for HCA\" {nic.name}: "
                              + self.paths.why_not(nic.name, gpu.bdf))
        if self.cuda.get(gpu.bdf, {}).get("gpu_direct_rdma_supported") == 0:
            return Gdr(False, "the GPU does not support GPUDirect RDMA (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED=0)")
        if read:
            refused = self.read_refusal(gpu)
            if refused:
                return Gdr(False, refused)
        distance = self.before_pxn[path.via][nic].type if path.via is not None else path.type
        if not self.level.admits(distance):
            origin = "NCCL's default" if self.level.raw is None else f"NCCL_NET_GDR_LEVEL={self.level.raw}"
            return Gdr(False, f"path {distance} is beyond the GDR level {self.level.name} ({origin})")
        return Gdr(True, f"path {distance} <= GDR level {self.level.name}")

    def read_refusal(self, gpu: Endpoint) -> str | None:
        """Why NCCL keeps the NIC from reading GPU memory on sends, or None."""
        setting = int_param(self.environ, "NCCL_NET_GDR_READ", -2)
        if setting == 0:
            return f"NCCL_NET_GDR_READ={self.environ['NCCL_NET_GDR_READ']} turns send-side GDR off"
        cc = self.capability(gpu)
        if setting > 0 or cc is None or cc >= PRE_AMPERE or len(self.gpus) == 1:
            return None
        if any(self.nvlink_count(gpu, peer) for peer in self.gpus if peer != gpu):
            return None
        nvlink = "no NVLink peer" if self.nvml else "no NVLink peer known (NVML unavailable)"
        return (f"sm{cc} is older than Ampere and has {nvlink}: NCCL_NET_GDR_READ's default keeps "
                "send-side GDR off to spare the PCIe bus")

    # -- step 3: PXN --------------------------------------------------------------------
    @functools.cached_property
    def table(self) -> dict[Endpoint, dict[Endpoint, PairPath]]:
        table = {gpu: dict(paths) for gpu, paths in self.before_pxn.items()}
        if int_param(self.environ, "NCCL_PXN_DISABLE", 0) == 1:
            return table
        pxn_level = "P2C" if int_param(self.environ, "NCCL_PXN_C2C", 1) else "PXB"
        for nic in self.nics:
            peer = self.local_gpu(nic)
            if peer is None:
                continue
            peer_path = self.before_pxn[peer][nic]
            if PATH_RANK[peer_path.type] > PATH_RANK[pxn_level] or not self.gdr(peer, nic, peer_path, True).on:
                continue
            for gpu in self.gpus:
                own = table[gpu][nic]
                if gpu == peer or not self.nvlink_count(gpu, peer):
                    continue
                if peer_path.bw > own.bw or PATH_RANK[own.type] > PATH_RANK["PXN"]:
                    table[gpu][nic] = PairPath("PXN", min(self.nvlink_gbs(gpu, peer), peer_path.bw), peer)
        return table


def mirror_bits(value: int, pow2: int) -> int:
    """NCCL's mirrorBits (src/include/utils.h): reverse the low log2(pow2) bits."""
    mirrored, bit, mirror_bit = 0, 1, pow2 >> 1
    while bit < pow2:
        if value & bit:
            mirrored |= mirror_bit
        bit, mirror_bit = bit << 1, mirror_bit >> 1
    return mirrored


def path_kind(path: PairPath) -> str:
    return {"PXN": "pxn", "P2C": "c2c"}.get(path.type, "direct")


def gpu_decision(machine: Machine, gpu: Endpoint) -> NcclGpuDecision:
    nic = machine.channel_nic(gpu, machine.table)
    candidates = tuple(n.name for n in machine.local(machine.table[gpu]))
    if nic is None:
        return NcclGpuDecision(gpu=gpu.name, gpu_bdf=gpu.bdf, nic=None, path="none", via_gpu=None,
                               path_type=None, bandwidth_gbs=0.0, gdr_write=False, gdr_read=False,
                               why=("no RDMA NIC that NCCL may use",), candidates=())
    path = machine.table[gpu][nic]
    write, read = machine.gdr(gpu, nic, path, False), machine.gdr(gpu, nic, path, True)
    why = [f"{nic.name} has the highest bandwidth ({path.bw:.1f} GB/s) and then the lowest path type "
           f"among {', '.join(candidates)}" if len(candidates) > 1 else
           f"{nic.name} is the only NIC with the highest bandwidth ({path.bw:.1f} GB/s) and lowest path type"]
    if path.via is not None:
        why.append(f"PXN: {gpu.name} sends through {path.via.name} over NVLink, "
                   f"{machine.before_pxn[path.via][nic].type} from there to {nic.name}")
    why += [f"receive: {write.reason}", f"send: {read.reason}"]
    if machine.nvml is None:
        why.append("NVLink and C2C unknown (NVML unavailable): PXN and P2C are not considered")
    if machine.capability(gpu) is None:
        why.append("compute capability unknown (no CUDA facts): the pre-Ampere send rule is not applied")
    return NcclGpuDecision(gpu=gpu.name, gpu_bdf=gpu.bdf, nic=nic.name, path=path_kind(path),
                           via_gpu=path.via.bdf if path.via else None, path_type=path.type,
                           bandwidth_gbs=round(path.bw, 2), gdr_write=write.on, gdr_read=read.on,
                           why=tuple(why), candidates=candidates)


def decide(ctx, environ=None) -> tuple[NcclGpuDecision, ...]:
    """Every GPU's decision; ``environ`` replaces the context's (what-if: a variable unset)."""
    machine = Machine(ctx, environ)
    return tuple(gpu_decision(machine, gpu) for gpu in machine.gpus)
