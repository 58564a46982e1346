"""For every GPU: the NIC NCCL will use, through which path, and whether with GPUDirect RDMA
for receives (the NIC writes GPU memory) and sends (the NIC reads it), decided by NCCL's
own rules (NVIDIA/nccl 2.30.7) over the node's facts (:class:`NodeFacts`, which the doctor
collects: :mod:`gdrprobe.doctor.facts.nccl_node`):

1. Path type and bandwidth of each GPU-NIC pair (``src/graph/paths.cc`` ncclTopoSetPaths):
   the worst hop (PIX, PXB, PHB, SYS; NODE is PHB); bandwidth is the narrowest link: each
   PCIe link (:func:`gdrprobe.nccl.topo.link_bandwidth_gbs`), the NIC's port speed / 8
   (``src/graph/topo.cc`` ncclTopoAddNet; each ACTIVE port NCCL_IB_HCA keeps is its own
   network device, :class:`Net`) and, across sockets, the inter-CPU link
   (``src/graph/topo.cc`` ncclTopoGetInterCpuBw with the ``src/graph/topo.h`` figures, by
   CPU vendor, family and model: :func:`gdrprobe.nccl.topo.inter_cpu_bandwidth`).
2. P2C (ncclTopoComputePaths, mergePathType): a GPU that reaches its CPU over C2C (Grace;
   NVML's C2C link count) gets P2C to the NICs of that CPU that are local to it.
3. PXN (ncclTopoComputePaths, "Update paths for NICs"): unless NCCL_PXN_DISABLE is exactly
   1, a GPU reaches a NIC through the NVLink peer ncclTopoGetLocalGpu names for it (none:
   no PXN), when that peer is at most P2C from it (PXB with NCCL_PXN_C2C=0) with GDR, and
   the peer has more bandwidth to it or our own path is PHB or SYS. NIC by NIC and GPU by
   GPU, each on the table as updated so far, as NCCL loops (see :attr:`Machine.table` for
   what is not modelled).
4. The NIC (topo.cc ncclTopoGetLocal / ncclTopoGetLocalNetType): the NICs with the highest
   bandwidth, then the lowest path type; among those, channel c takes
   ``dev % localGpuCount`` (bits mirrored when the NIC count is a power of two) plus
   ``c % netsPerGpu``, where dev is NVML's index of the GPU (PCI bus order of all the
   node's GPUs, not the CUDA ordinal), localGpuCount the GPUs local to the first of those
   NICs and netsPerGpu set by NCCL_NETDEVS_POLICY (AUTO: DIVUP(NICs, GPUs); ALL; MAX:n).
5. GDR (ncclTopoCheckGdr): the NIC must support it (:mod:`gdrprobe.nccl.gdr_support`),
   the GPU too; for sends, NCCL_NET_GDR_READ=0 turns it off, and its default turns it off
   on GPUs before sm80 that have no NVLink peer (unless they are the only GPU); then the
   path type (the proxy GPU's, for PXN) must not exceed the GDR level.

NVLink and C2C come from NVML; without it there is neither PXN nor P2C to see, and the
decision says so.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

from gdrprobe.nccl.env import (gdr_level, int_param, netdevs_policy, parse_hca_filter,
                               pxn_disabled)
from gdrprobe.nccl.gdr_support import MemoryPaths
from gdrprobe.nccl.topo import (NET_FALLBACK_GBPS, PATH_RANK, InterCpu, PcieEndpoint, PcieLink, Port,
                                inter_cpu_bandwidth, link_bandwidth_gbs, nccl_path_type, nccl_ports,
                                nvlink_gbs_per_link, pcie_distance)
from gdrprobe.report.model import NcclGpuDecision

PRE_AMPERE = 80


# ---- the facts the rules read -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """What the CUDA driver and NVML say of one GPU; None or empty where they did not say."""

    capability: int | None = None          # compute capability x 10 (90: sm90)
    gdr_supported: bool | None = None      # CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
    c2c_links: int = 0                     # NVML's C2C link count (Grace)
    nvlinks: tuple[str, ...] = ()          # bus id at the far end of each active NVLink


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What NCCL's rules read of one node, gathered once by whoever reads the machine."""

    gpus: tuple[PcieEndpoint, ...]         # NVIDIA GPUs, in PCI bus order
    nics: tuple[PcieEndpoint, ...]         # RDMA devices with a PCI function
    ports: Mapping[str, tuple[Port, ...]]  # NIC name -> its ports (empty: sysfs lists none)
    links: Mapping[str, PcieLink]          # bus id -> its PCIe link, for every GPU and NIC
    gpu_facts: Mapping[str, GpuFacts]      # bus id -> the CUDA driver's and NVML's facts
    nvml_order: tuple[str, ...] | None     # NVML's GPUs (bus ids) by index; None: NVML unavailable
    cpuinfo: str                           # /proc/cpuinfo
    gdr_support: MemoryPaths               # per NIC and GPU: can NCCL register GPU memory

    def gpu(self, bdf: str) -> GpuFacts:
        return self.gpu_facts.get(bdf, GpuFacts())


# ---- what the rules work on ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PairPath:
    type: str                        # NCCL path type
    bw: float                        # GB/s
    via: PcieEndpoint | None = None  # the NVLink peer a PXN path relays through


@dataclasses.dataclass(frozen=True)
class Net:
    """One of NCCL's network devices: a port of an RDMA device (src/transport/net_ib/init.cc
    ncclIbInitDevices makes every ACTIVE port NCCL_IB_HCA keeps its own device)."""

    device: PcieEndpoint
    port: int | None               # None: sysfs lists no port (a capture without them)
    gbs: float                     # topo.cc ncclTopoAddNet: the port's Mb/s / 8000
    label: str                     # the device's name, with ":port" where it has several nets


@dataclasses.dataclass(frozen=True)
class Gdr:
    on: bool
    reason: str


class Machine:
    """NCCL's rules applied to one node's facts under one environment."""

    def __init__(self, facts: NodeFacts, environ: Mapping[str, str]):
        self.facts = facts
        self.environ = environ
        self.gpus = facts.gpus
        hca = environ.get("NCCL_IB_HCA")
        self.hca = parse_hca_filter(hca) if hca is not None else None
        self.nets = tuple(net for nic in facts.nics for net in self.device_nets(nic))
        self.policy = netdevs_policy(environ)
        self.paths = facts.gdr_support
        self.level = gdr_level(environ)
        # Memoised per machine (a class-level cache would keep every Machine alive).
        self.link_gbs = functools.cache(self._link_gbs)
        self.direct = functools.cache(self._direct)

    # -- facts ----------------------------------------------------------------------
    @functools.cached_property
    def inter_cpu(self) -> InterCpu:
        return inter_cpu_bandwidth(self.facts.cpuinfo)

    def _link_gbs(self, bdf: str) -> float:
        return link_bandwidth_gbs(self.facts.links.get(bdf, PcieLink()))

    def device_nets(self, nic: PcieEndpoint) -> list[Net]:
        """The device's ports NCCL opens, in port order; a device whose ports sysfs does not
        list counts as one net at NCCL's fallback speed, unless NCCL_IB_HCA drops it."""
        listed = self.facts.ports.get(nic.name, ())
        ports = nccl_ports(nic.name, listed, self.hca)
        if ports:
            return [Net(nic, port.number, port.nccl_gbps / 8.0,
                        nic.name if len(ports) == 1 else f"{nic.name}:{port.number}") for port in ports]
        if listed or (self.hca is not None and not self.hca.selects(nic.name)):
            return []
        return [Net(nic, None, NET_FALLBACK_GBPS / 8.0, nic.name)]

    def capability(self, gpu: PcieEndpoint) -> int | None:
        return self.facts.gpu(gpu.bdf).capability

    def c2c(self, gpu: PcieEndpoint) -> bool:
        return bool(self.facts.gpu(gpu.bdf).c2c_links)

    def nvlinks(self, gpu: PcieEndpoint) -> list[str]:
        return list(self.facts.gpu(gpu.bdf).nvlinks)

    def nvlink_count(self, gpu: PcieEndpoint, peer: PcieEndpoint) -> int:
        """Links between two GPUs: direct ones, or, through NVSwitches (far ends that are no
        GPU of this node), the fewer of the two GPUs' switch links."""
        gpu_bdfs = {g.bdf for g in self.gpus}
        direct = self.nvlinks(gpu).count(peer.bdf)
        if direct:
            return direct
        switched = [len([r for r in self.nvlinks(g) if r not in gpu_bdfs]) for g in (gpu, peer)]
        return min(switched)

    def nvlink_gbs(self, gpu: PcieEndpoint, peer: PcieEndpoint) -> float:
        return self.nvlink_count(gpu, peer) * nvlink_gbs_per_link(self.capability(gpu))

    # -- step 1 and 2: the direct paths ------------------------------------------------
    def _direct(self, gpu: PcieEndpoint, net: Net) -> PairPath:
        kind = nccl_path_type(gpu, net.device)
        # Over C2C the GPU's own PCIe link is not on the way to the CPU's NICs.
        gpu_link = float("inf") if self.c2c(gpu) and kind != "SYS" else self.link_gbs(gpu.bdf)
        bw = min(gpu_link, self.link_gbs(net.device.bdf), net.gbs)
        if kind == "SYS":
            bw = min(bw, self.inter_cpu.gbs)
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
    def before_pxn(self) -> dict[PcieEndpoint, dict[Net, PairPath]]:
        table = {gpu: {net: self.direct(gpu, net) for net in self.nets} for gpu in self.gpus}
        for gpu in self.gpus:
            if not self.c2c(gpu):
                continue
            for net in self.local(table[gpu]):
                if table[gpu][net].type == "PHB" and pcie_distance(gpu, net.device) in ("PHB", "NODE"):
                    table[gpu][net] = dataclasses.replace(table[gpu][net], type="P2C")
        return table

    def local_gpus(self, nic: Net) -> list[PcieEndpoint]:
        """The NIC's own GPUs (PXN is one-way, GPU to NIC, so the direct paths count)."""
        return self.local({gpu: self.before_pxn[gpu][nic] for gpu in self.gpus})

    def nvml_index(self, gpu: PcieEndpoint) -> int:
        """NCCL's gpu.dev: NVML's index (src/graph/xml.cc ncclTopoGetXmlFromGpu ->
        ncclNvmlDeviceGetIndex), not the CUDA ordinal, which CUDA_VISIBLE_DEVICES and
        CUDA_DEVICE_ORDER change. NVML numbers every GPU of the node in PCI bus order; its
        list is in index order, and without it the bus order stands in."""
        listed = self.facts.nvml_order or ()
        if gpu.bdf in listed:
            return listed.index(gpu.bdf)
        return sorted(g.bdf for g in self.gpus).index(gpu.bdf)

    def nets_per_gpu(self, gpu: PcieEndpoint, table) -> int:
        nets = self.local(table[gpu])
        return self.policy.nets_per_gpu(len(nets), len(self.local_gpus(nets[0]))) if nets else 0

    def channel_nic(self, gpu: PcieEndpoint, table, channel: int = 0) -> Net | None:
        """topo.cc ncclTopoGetLocalNetType: start at ``dev % localGpuCount`` (localGpuCount:
        the GPUs local to the first local NIC; bits mirrored when the NIC count is a power
        of two), then ``channel % netsPerGpu`` further (NCCL_NETDEVS_POLICY)."""
        nets = self.local(table[gpu])
        if not nets:
            return None
        index = self.nvml_index(gpu) % max(len(self.local_gpus(nets[0])), 1)
        if len(nets) & (len(nets) - 1) == 0:
            index = mirror_bits(index, len(nets))
        index += channel % self.nets_per_gpu(gpu, table)
        return nets[index % len(nets)]

    def local_gpu(self, nic: Net, table) -> PcieEndpoint | None:
        """topo.cc ncclTopoGetLocalGpu: over channels, then the NIC's own GPUs in order, the
        first whose channel lands on the NIC; None (NCCL's -1: no PXN relay) when none does.
        Channels repeat every netsPerGpu, which is at most the NIC count."""
        for channel in range(max(len(self.nets), 1)):
            for gpu in self.local_gpus(nic):
                if self.channel_nic(gpu, table, channel) == nic:
                    return gpu
        return None

    # -- step 5: the GDR gate -----------------------------------------------------------
    def gdr(self, gpu: PcieEndpoint, nic: Net, path: PairPath, read: bool) -> Gdr:
        device = nic.device.name
        if not self.paths.nic_gdr(device, gpu.bdf):
            return Gdr(False, f"NCCL says \"GPU Direct RDMA Disabled for HCA\" {device}: "
                              + self.paths.why_not(device, gpu.bdf))
        if self.facts.gpu(gpu.bdf).gdr_supported is False:
            return Gdr(False, "the GPU does not support GPUDirect RDMA "
                              "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED=0)")
        if read:
            refused = self.read_refusal(gpu)
            if refused:
                return Gdr(False, refused)
        distance = self.before_pxn[path.via][nic].type if path.via is not None else path.type
        origin = ("NCCL's default" if self.level.raw is None else
                  f"NCCL_NET_GDR_LEVEL={self.level.raw} is undefined in NCCL, default assumed" if self.level.undefined
                  else f"NCCL_NET_GDR_LEVEL={self.level.raw}")
        if not self.level.admits(distance):
            return Gdr(False, f"path {distance} is beyond the GDR level {self.level.name} ({origin})")
        if self.level.undefined:
            return Gdr(True, f"path {distance} <= GDR level {self.level.name} ({origin})")
        return Gdr(True, f"path {distance} <= GDR level {self.level.name}")

    def read_refusal(self, gpu: PcieEndpoint) -> str | None:
        """Why NCCL keeps the NIC from reading GPU memory on sends, or None."""
        setting = int_param(self.environ, "NCCL_NET_GDR_READ", -2)
        if setting == 0:
            return f"NCCL_NET_GDR_READ={self.environ['NCCL_NET_GDR_READ']} turns send-side GDR off"
        cc = self.capability(gpu)
        if setting > 0 or cc is None or cc >= PRE_AMPERE or len(self.gpus) == 1:
            return None
        if any(self.nvlink_count(gpu, peer) for peer in self.gpus if peer != gpu):
            return None
        nvlink = "no NVLink peer" if self.nvml_known else "no NVLink peer known (NVML unavailable)"
        return (f"sm{cc} is older than Ampere and has {nvlink}: NCCL_NET_GDR_READ's default keeps "
                "send-side GDR off to spare the PCIe bus")

    @property
    def nvml_known(self) -> bool:
        return self.facts.nvml_order is not None

    # -- step 3: PXN --------------------------------------------------------------------
    @functools.cached_property
    def table(self) -> dict[PcieEndpoint, dict[Net, PairPath]]:
        """paths.cc ncclTopoComputePaths, "Update paths for NICs": NIC by NIC, GPU by GPU,
        the relay (ncclTopoGetLocalGpu) is looked up on the table as updated so far. Not
        modelled: the same loop's diversion through the CPU of pairs nearer than PHB
        without GDR (addInterStep CPU), which can change later NICs' relays."""
        table = {gpu: dict(paths) for gpu, paths in self.before_pxn.items()}
        if pxn_disabled(self.environ):
            return table
        pxn_level = "P2C" if int_param(self.environ, "NCCL_PXN_C2C", 1) else "PXB"
        for nic in self.nets:
            for gpu in self.gpus:
                # Asked again for every pair, as NCCL does: earlier PXN paths change the answer.
                peer = self.local_gpu(nic, table)
                if peer is None or peer == gpu or not self.nvlink_count(gpu, peer):
                    continue
                peer_path, own = table[peer][nic], table[gpu][nic]
                if PATH_RANK[peer_path.type] > PATH_RANK[pxn_level] or not self.gdr(peer, nic, peer_path, True).on:
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


# ---- the decision, said ---------------------------------------------------------------


def path_kind(path: PairPath) -> str:
    return {"PXN": "pxn", "P2C": "c2c"}.get(path.type, "direct")


def no_nic_decision(gpu: PcieEndpoint) -> NcclGpuDecision:
    return NcclGpuDecision(gpu=gpu.name, gpu_bdf=gpu.bdf, nic=None, path="none", via_gpu=None,
                           path_type=None, bandwidth_gbs=0.0, gdr_write=False, gdr_read=False,
                           why=("no RDMA NIC that NCCL may use",), candidates=())


def gpu_decision(machine: Machine, gpu: PcieEndpoint) -> NcclGpuDecision:
    nic = machine.channel_nic(gpu, machine.table)
    if nic is None:
        return no_nic_decision(gpu)
    candidates = tuple(n.label for n in machine.local(machine.table[gpu]))
    path = machine.table[gpu][nic]
    write, read = machine.gdr(gpu, nic, path, False), machine.gdr(gpu, nic, path, True)
    why = [f"{nic.label} has the highest bandwidth ({path.bw:.1f} GB/s) and then the lowest path type "
           f"among {', '.join(candidates)}" if len(candidates) > 1 else
           f"{nic.label} is the only NIC with the highest bandwidth ({path.bw:.1f} GB/s) and lowest path type"]
    if path.via is not None:
        why.append(f"PXN: {gpu.name} sends through {path.via.name} over NVLink, "
                   f"{machine.before_pxn[path.via][nic].type} from there to {nic.label}")
    why += [f"receive: {write.reason}", f"send: {read.reason}"]
    if any(p.type == "SYS" for p in machine.before_pxn[gpu].values()):
        why.append(f"across sockets NCCL counts {machine.inter_cpu.gbs:g} GB/s (topo.cc ncclTopoGetInterCpuBw): "
                   + machine.inter_cpu.source)
    if not machine.nvml_known:
        why.append("NVLink and C2C unknown (NVML unavailable): PXN and P2C are not considered")
    if machine.capability(gpu) is None:
        why.append("compute capability unknown (no CUDA facts): the pre-Ampere send rule is not applied")
    return NcclGpuDecision(gpu=gpu.name, gpu_bdf=gpu.bdf, nic=nic.device.name, path=path_kind(path),
                           via_gpu=path.via.bdf if path.via else None, path_type=path.type,
                           bandwidth_gbs=round(path.bw, 2), gdr_write=write.on, gdr_read=read.on,
                           why=tuple(why), candidates=candidates)


def decide(facts: NodeFacts, environ: Mapping[str, str]) -> tuple[NcclGpuDecision, ...]:
    """Every GPU's decision under ``environ``, the environment as NCCL sees it (a what-if:
    the same facts with a variable unset)."""
    machine = Machine(facts, environ)
    return tuple(gpu_decision(machine, gpu) for gpu in machine.gpus)
