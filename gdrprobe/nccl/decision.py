"""For every GPU: the NIC NCCL will use, through which path, and whether with GPUDirect RDMA
for receives (the NIC writes GPU memory) and sends (the NIC reads it), decided by NCCL's
own rules (NVIDIA/nccl 2.30.7 and 2.31, other releases where :mod:`gdrprobe.nccl.versions`
says they differ) over the node's facts (:class:`NodeFacts`, which the doctor collects:
:mod:`gdrprobe.doctor.facts.nccl_node`):

1. Path type and bandwidth of each GPU-NIC pair (``src/graph/paths.cc`` ncclTopoSetPaths):
   the worst hop on NCCL's PCI tree, with Broadcom switches flattened
   (:class:`gdrprobe.nccl.topo.NcclPciTree`); bandwidth is the narrowest link: each PCIe
   link (:func:`gdrprobe.nccl.topo.link_bandwidth_gbs`), the network device's speed
   (:mod:`gdrprobe.nccl.nets`: a port, or a virtual NIC fused from several) and, across
   sockets, the inter-CPU link (``src/graph/topo.cc`` ncclTopoGetInterCpuBw).
2. P2C (ncclTopoComputePaths, mergePathType): a GPU that reaches its CPU over C2C (Grace;
   NVML's C2C link count) gets P2C to the NICs of that CPU that are local to it.
3. The NIC loop of ncclTopoComputePaths, NIC by NIC and GPU by GPU on the paths as updated
   so far: PXN first (unless NCCL_PXN_DISABLE is exactly 1, a GPU reaches the NIC through
   the NVLink peer ncclTopoGetLocalGpu names for it, when that peer is at most P2C from it
   (PXB with NCCL_PXN_C2C=0) with GDR, and has more bandwidth to it or our own path is PHB
   or SYS); then a path nearer than PHB on which GDR is off (ncclTopoCheckGdr: the NIC
   cannot do GDR, or the path is beyond the GDR level) is routed through the CPU local to
   the GPU (addInterStep), both ways: it becomes PHB, so NICs tie that did not, and a
   farther NIC with GDR beats a nearer one without.
4. The NIC (topo.cc ncclTopoGetLocal / ncclTopoGetLocalNetType): the NICs with the highest
   bandwidth, then the lowest path type; among those, channel c takes
   ``dev % localGpuCount`` (bits mirrored when the NIC count is a power of two) plus
   ``c % netsPerGpu``, where dev is NVML's index of the GPU (PCI bus order of all the
   node's GPUs, not the CUDA ordinal), localGpuCount the GPUs local to the first of those
   NICs (on the NIC-to-GPU paths, which the detour of step 3 changes and PXN does not) and
   netsPerGpu set by NCCL_NETDEVS_POLICY (AUTO: DIVUP(NICs, GPUs); ALL; MAX:n).
5. GDR (ncclTopoCheckGdr): the NIC must support it (:mod:`gdrprobe.nccl.gdr_support`),
   the GPU too, and an MLO partition needs NCCL_NET_GDR_MLOPART; for sends,
   NCCL_NET_GDR_READ=0 turns it off, and its default turns it off on GPUs before sm80 that
   have no NVLink peer (unless they are the only GPU); then the path type (the proxy GPU's,
   for PXN) must not exceed the GDR level. Its mode is PCI (a PCIe mapping forced) for a C2C
   GPU whose path to the NIC is not P2C, else Default. Where GDR is on, the memory is
   registered through DMA-BUF or peer memory (``src/transport/net.cc`` useDmaBuf:
   :meth:`gdrprobe.nccl.gdr_support.MemoryPaths.kind`).

NCCL's topology holds the communicator's GPUs, not the node's (``src/graph/topo.cc``
ncclTopoGetSystem fills a GPU for each rank on this host): the GPUs the job uses
(``job_gpus``; all of the node's when not given) are the ones steps 2-5 count (the local
GPUs, the PXN relays, "the only GPU", the NVLink peers), while NVML's index and which NVLink
ends are NVSwitches stay the node's.

Some settings decide alone, whatever the topology (:mod:`gdrprobe.nccl.refusals`):
NCCL_IB_DISABLE, NCCL_NET naming the socket transport, and a GDR level below every path a
GPU can have to a NIC; the decision says so for every GPU, and holds where the topology
could not be read. So does a data-direct lookup error that stops NCCL's IB transport
(:func:`gdrprobe.nccl.data_direct.ib_init_failure`, 2.28.3 on): the node's, not a setting's.

NVLink and C2C come from NVML as NCCL reads it; where unread, a GPU whose GPUDirect RDMA
they could give back is undecided (:mod:`gdrprobe.nccl.unread`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Mapping

from gdrprobe.nccl import data_direct, unread
from gdrprobe.nccl.cparse import atoi
from gdrprobe.nccl import params
from gdrprobe.nccl.env import netdevs_policy, parse_hca_filter, pxn_disabled
from gdrprobe.nccl.gdr_support import MemoryPaths
from gdrprobe.nccl.local_choice import Paths, local
from gdrprobe.nccl.nets import Net, NetBuilder, data_direct_net, physical_nets
from gdrprobe.nccl.refusals import transport_refusal
from gdrprobe.nccl.topo import (InterCpu, NcclPciTree, PcieEndpoint, PcieLink, Port,
                                inter_cpu_bandwidth, link_bandwidth_gbs, nvlink_gbs_per_link, same_cpu)
from gdrprobe.nccl.versions import GDR_C2C_SINCE, NcclRules, dotted
from gdrprobe.report.model import NcclChannel, NcclGpuDecision

PRE_AMPERE = 80
SOCKET_PATH = "socket"     # the decision's path where NCCL's socket transport carries the GPU's traffic
# Settings NCCL leaves off by design and a job turns on to get GPUDirect: MLO partitions get
# none unless NCCL_NET_GDR_MLOPART is set (paths.cc ncclTopoCheckGdr, 2.30.7). Off under
# them is NCCL's policy, not a fault of the node.
OPT_IN_SETTINGS = {params.NET_GDR_MLOPART.name: "1"}
MLOPART = "MLOPart"        # src/init.cc fillInfo: strstr(prop.name, "MLOPart")


# ---- the facts the rules read -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """What the CUDA driver and NVML say of one GPU; None or empty where they did not say."""

    capability: int | None = None          # compute capability x 10 (90: sm90)
    gdr_supported: bool | None = None      # CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
    c2c_links: int = 0                     # NVML's C2C link count (Grace)
    nvlinks: tuple[str, ...] = ()          # bus id at the far end of each active NVLink
    mlo_part: int | None = None            # the MLO partition this CUDA device is (mlo_partition)
    links_unread: str = ""                 # why NVML's NVLink and C2C facts are unknown ("": read)


def mlo_partition(cuda_name: str | None) -> int | None:
    """The MLO partition a CUDA device is, as NCCL reads it from the device's name (src/init.cc
    fillInfo, 2.30.7: ``strstr(prop.name, "MLOPart")`` and ``atoi`` of what follows); None:
    a whole GPU."""
    at = (cuda_name or "").find(MLOPART)
    return None if at < 0 else atoi(cuda_name[at + len(MLOPART):])


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What NCCL's rules read of one node, gathered once by whoever reads the machine."""

    gpus: tuple[PcieEndpoint, ...]         # NVIDIA GPUs, in PCI bus order
    nics: tuple[PcieEndpoint, ...]         # RDMA devices with a PCI function, in bus order
    ports: Mapping[str, tuple[Port, ...]]  # NIC name -> its ports (empty: sysfs lists none)
    links: Mapping[str, PcieLink]          # bus id -> its PCIe link, for every GPU and NIC
    gpu_facts: Mapping[str, GpuFacts]      # bus id -> the CUDA driver's and NVML's facts
    nvml_order: tuple[str, ...] | None     # NVML's GPUs (bus ids) by index; None: NVML unavailable
    cpuinfo: str                           # /proc/cpuinfo
    gdr_support: MemoryPaths               # per NIC and GPU: can NCCL register GPU memory
    # bridge bus id -> the id NCCL gives a switch (topo.pci_device_id); none: no switch is flattened
    switch_ids: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # bus id -> where NCCL's topology file puts the device, or why it does not (said in the why)
    placement: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # RDMA device -> its data-direct device (named <dev>_dma, at the path libmlx5 gives),
    # where NCCL's sequence finds one (gdrprobe.nccl.data_direct)
    data_direct: Mapping[str, PcieEndpoint] = dataclasses.field(default_factory=dict)
    # RDMA device -> its data-direct lookup's error other than ENODEV (data_direct.DataDirectProbe)
    data_direct_errors: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def gpu(self, bdf: str) -> GpuFacts:
        return self.gpu_facts.get(bdf, GpuFacts())


# ---- what the rules work on ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PairPath:
    type: str                        # NCCL path type
    bw: float                        # GB/s
    via: PcieEndpoint | None = None  # the NVLink peer a PXN path relays through
    detour: tuple[str, str] | None = None  # routed through the CPU: the type it had, why GDR was off


@dataclasses.dataclass(frozen=True)
class Gdr:
    on: bool
    reason: str
    mode: str = "disabled"           # ncclTopoGdrMode: disabled, default, pci


def merge_path_type(first: str, second: str, rank: Mapping[str, int]) -> str:
    """paths.cc mergePathType: the worse of two, but C2C then PHB is P2C."""
    if {first, second} == {"C2C", "PHB"}:
        return "P2C"
    return max(first, second, key=rank.__getitem__)


class Machine:
    """NCCL's rules applied to one node's facts under one environment."""

    def __init__(self, facts: NodeFacts, environ: Mapping[str, str], rules: NcclRules | None = None,
                 job_gpus: Collection[str] | None = None):
        self.facts = facts
        self.environ = environ
        self.rules = rules or NcclRules()
        self.rank = self.rules.path_rank
        # The communicator's GPUs (the job's) are NCCL's GPUs; the node's stay for NVML's
        # index and for telling an NVSwitch (a far end that is no GPU of the node) apart.
        self.gpus = tuple(gpu for gpu in facts.gpus if job_gpus is None or gpu.bdf in job_gpus)
        data_direct_devices = tuple(facts.data_direct.values())
        self.tree = NcclPciTree(facts.gpus + facts.nics + data_direct_devices, dict(facts.switch_ids),
                                self.rules.bcm_flatten)
        hca = params.IB_HCA.raw(environ)
        self.hca = parse_hca_filter(hca) if hca is not None else None
        physical = [net for nic in facts.nics for net in self.nic_nets(nic)]
        # ncclTopoGetPath compares places in NCCL's XML, before any switch is flattened.
        unflattened = NcclPciTree(facts.nics + data_direct_devices, {}, None)
        self.nets = tuple(NetBuilder(environ, unflattened, self.rules.nic_fusion).fuse(physical))
        self.policy = netdevs_policy(environ)
        # NCCL_DMABUF_ENABLE is read from this environment, like every other variable.
        self.support = facts.gdr_support.under(environ)
        self.level = self.rules.gdr_level(environ)
        self.node_gpu_bdfs = {gpu.bdf for gpu in facts.gpus}
        # Memoised per machine (a class-level cache would keep every Machine alive).
        self.link_gbs = functools.cache(self._link_gbs)
        self.direct = functools.cache(self._direct)
        self.nvml_index = functools.cache(self._nvml_index)

    def nic_nets(self, nic: PcieEndpoint) -> list[Net]:
        """The network devices NCCL opens for one RDMA device, port by port: the port, its
        data-direct face, or both, as NCCL_IB_DATA_DIRECT and the release say
        (:func:`gdrprobe.nccl.data_direct.exposed`)."""
        ports = physical_nets(nic, self.facts.ports.get(nic.name, ()), self.hca)
        device = self.facts.data_direct.get(nic.name)
        if device is None:
            return ports
        faces = data_direct.exposed(self.rules, self.environ)
        return [net for port in ports
                for net in ([port] if data_direct.ORDINARY in faces else [])
                + ([data_direct_net(port, device)] if data_direct.DATA_DIRECT in faces else [])]

    @functools.cached_property
    def refusal(self) -> str | None:
        """Why no GPU's traffic takes an RDMA NIC at all: the settings, or the node's
        data-direct lookup stopping the IB transport."""
        return transport_refusal(self.environ, self.rules) or data_direct.ib_init_failure(
            self.rules, self.environ, self.facts.data_direct_errors, self.facts.ports)

    # -- facts ----------------------------------------------------------------------
    @functools.cached_property
    def inter_cpu(self) -> InterCpu:
        return inter_cpu_bandwidth(self.facts.cpuinfo, self.rules.inter_cpu_by_generation)

    def _link_gbs(self, bdf: str) -> float:
        return link_bandwidth_gbs(self.facts.links.get(bdf, PcieLink()))

    def capability(self, gpu: PcieEndpoint) -> int | None:
        return self.facts.gpu(gpu.bdf).capability

    def c2c(self, gpu: PcieEndpoint) -> bool:
        return bool(self.facts.gpu(gpu.bdf).c2c_links)

    def nvlinks(self, gpu: PcieEndpoint) -> list[str]:
        return list(self.facts.gpu(gpu.bdf).nvlinks)

    def nvlink_count(self, gpu: PcieEndpoint, peer: PcieEndpoint) -> int:
        """Links between two GPUs: direct ones, or, through NVSwitches (far ends that are no
        GPU of this node), the fewer of the two GPUs' switch links."""
        direct = self.nvlinks(gpu).count(peer.bdf)
        if direct:
            return direct
        switched = [len([r for r in self.nvlinks(g) if r not in self.node_gpu_bdfs]) for g in (gpu, peer)]
        return min(switched)

    def nvlink_gbs(self, gpu: PcieEndpoint, peer: PcieEndpoint) -> float:
        return self.nvlink_count(gpu, peer) * nvlink_gbs_per_link(self.capability(gpu))

    def links_unread(self) -> str:
        """Why the NVLink and C2C facts of some of NCCL's GPUs are unknown ("": all read)."""
        return next(filter(None, (self.facts.gpu(g.bdf).links_unread for g in self.gpus)), "")

    # -- steps 1 and 2: the direct paths ----------------------------------------------
    def cpu_to_net(self, gpu: PcieEndpoint, net: Net) -> tuple[str, float]:
        """The path from the GPU's CPU to the NIC: PHB on the same CPU, SYS across."""
        bw = min(self.link_gbs(net.device.bdf), net.gbs)
        if same_cpu(gpu, net.device):
            return "PHB", bw
        return "SYS", min(bw, self.inter_cpu.gbs)

    def _direct(self, gpu: PcieEndpoint, net: Net) -> PairPath:
        kind = self.tree.path_type(gpu, net.device)
        # Over C2C the GPU's own PCIe link is not on the way to the CPU's NICs.
        gpu_link = float("inf") if self.c2c(gpu) and kind != "SYS" else self.link_gbs(gpu.bdf)
        bw = min(gpu_link, self.link_gbs(net.device.bdf), net.gbs)
        if kind == "SYS":
            bw = min(bw, self.inter_cpu.gbs)
        return PairPath(kind, bw)

    def local(self, options: dict) -> list:
        """ncclTopoGetLocal: the highest bandwidth, then the lowest path type, in index order."""
        return local(options, self.rank)

    @functools.cached_property
    def before_pxn(self) -> dict[PcieEndpoint, dict[Net, PairPath]]:
        """The direct paths, with P2C from a C2C GPU to the NICs of its CPU: its local ones
        from 2.29.2, every one in 2.27.3-2.29.1 (versions.NcclRules.p2c_local_nics_only)."""
        table = {gpu: {net: self.direct(gpu, net) for net in self.nets} for gpu in self.gpus}
        if not self.rules.p2c_path:
            return table
        for gpu in self.gpus:
            if not self.c2c(gpu):
                continue
            for net in self.local(table[gpu]) if self.rules.p2c_local_nics_only else self.nets:
                path = table[gpu][net]
                if same_cpu(gpu, net.device) and path.type == "PHB":
                    table[gpu][net] = dataclasses.replace(path, type="P2C")
        return table

    def start_paths(self) -> Paths:
        return Paths({gpu: dict(paths) for gpu, paths in self.before_pxn.items()},
                     {net: {gpu: self.before_pxn[gpu][net] for gpu in self.gpus} for net in self.nets},
                     self.rank)

    # -- step 4: the NIC a channel uses -------------------------------------------------
    def _nvml_index(self, gpu: PcieEndpoint) -> int:
        """NCCL's gpu.dev: NVML's index (src/graph/xml.cc ncclTopoGetXmlFromGpu ->
        ncclNvmlDeviceGetIndex), not the CUDA ordinal, which CUDA_VISIBLE_DEVICES and
        CUDA_DEVICE_ORDER change. NVML numbers every GPU of the node in PCI bus order; its
        list is in index order, and without it the bus order stands in."""
        listed = self.facts.nvml_order or ()
        if gpu.bdf in listed:
            return listed.index(gpu.bdf)
        return sorted(self.node_gpu_bdfs).index(gpu.bdf)

    def nets_per_gpu(self, gpu: PcieEndpoint, paths: Paths) -> int:
        return self.channel_start(gpu, paths)[1]

    def channel_start(self, gpu: PcieEndpoint, paths: Paths) -> tuple[int, int]:
        """topo.cc ncclTopoGetLocalNetType: (the first channel's place among the GPU's local
        NICs, netsPerGpu); the place is ``dev % localGpuCount`` (localGpuCount: the GPUs
        local to the first local NIC; bits mirrored when the NIC count is a power of two),
        netsPerGpu NCCL_NETDEVS_POLICY's; (0, 0) without a local NIC."""
        nets = paths.local_nets(gpu)
        if not nets:
            return 0, 0
        local_gpus = len(paths.local_gpus(nets[0]))
        index = self.nvml_index(gpu) % max(local_gpus, 1)
        if len(nets) & (len(nets) - 1) == 0:
            index = mirror_bits(index, len(nets))
        return index, self.policy.nets_per_gpu(len(nets), local_gpus)

    def channel_nic(self, gpu: PcieEndpoint, paths: Paths, channel: int = 0) -> Net | None:
        """The NIC of a channel: ``channel % netsPerGpu`` past the first channel's."""
        nets = paths.local_nets(gpu)
        start, per_gpu = self.channel_start(gpu, paths)
        return nets[(start + channel % per_gpu) % len(nets)] if nets else None

    def local_gpu(self, net: Net, paths: Paths) -> PcieEndpoint | None:
        """topo.cc ncclTopoGetLocalGpu: over channels, then the NIC's own GPUs in order, the
        first whose channel lands on the NIC; None (NCCL's -1: no PXN relay) when none does.
        Channels repeat every netsPerGpu, so a GPU's first channel on the NIC is found from
        the NIC's place among its local NICs, not channel by channel."""
        found, first = None, None
        for gpu in paths.local_gpus(net):
            at = paths.local_net_index(gpu, net)
            if at is None:
                continue
            start, per_gpu = self.channel_start(gpu, paths)
            channel = (at - start) % len(paths.local_nets(gpu))
            if channel < per_gpu and (first is None or channel < first):
                found, first = gpu, channel
        return found

    # -- step 5: the GDR gate -----------------------------------------------------------
    def gdr(self, gpu: PcieEndpoint, net: Net, path: PairPath, read: bool, paths: Paths) -> Gdr:
        device = net.ibdev
        if not self.support.nic_gdr(device, gpu.bdf):
            return Gdr(False, f"{self.rules.library} says \"GPU Direct RDMA Disabled for HCA\" {device}: "
                              + self.support.why_not(device, gpu.bdf))
        if self.facts.gpu(gpu.bdf).gdr_supported is False:
            return Gdr(False, "the GPU does not support GPUDirect RDMA "
                              "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED=0)")
        if self.facts.gpu(gpu.bdf).mlo_part is not None and not self.rules.mlo_part_gdr(self.environ):
            return Gdr(False, f"the GPU is MLO partition {self.facts.gpu(gpu.bdf).mlo_part}: NCCL gives "
                              "partitions no GPUDirect RDMA unless NCCL_NET_GDR_MLOPART is set non-zero "
                              "(paths.cc ncclTopoCheckGdr, 2.30.7)")
        if read:
            refused = self.read_refusal(gpu)
            if refused:
                return Gdr(False, refused)
        proxy = path.via or gpu
        distance = paths.to_net[proxy][net].type if path.via is not None else path.type
        compared = self.rules.gdr_distance(distance, self.c2c(proxy), self.environ)
        shown = distance if compared == distance else f"{distance} (counted as C2C by NCCL_NET_GDR_C2C)"
        if not self.level.admits(compared):
            if path.detour:
                return Gdr(False, f"{path.detour[1]}, so NCCL routes it through the CPU: {path.type}")
            return Gdr(False, f"path {shown} is beyond the GDR level {self.level.name} ({self.level_origin})")
        mode = self.gdr_mode(proxy, compared)
        if self.level.undefined:
            return Gdr(True, f"path {shown} <= GDR level {self.level.name} ({self.level_origin})", mode)
        return Gdr(True, f"path {shown} <= GDR level {self.level.name}", mode)

    @functools.cached_property
    def level_origin(self) -> str:
        """Where the GDR level comes from, as the reasons say it."""
        if self.level.raw is None:
            return "NCCL's default"
        if self.level.undefined:
            return f"NCCL_NET_GDR_LEVEL={self.level.raw} is undefined in NCCL, default assumed"
        return f"NCCL_NET_GDR_LEVEL={self.level.raw}"

    def gdr_mode(self, proxy: PcieEndpoint, distance: str) -> str:
        """ncclTopoCheckGdr (2.26.2 on): a PCIe mapping is forced when the GPU reaches its CPU
        over C2C but the NIC is not reached that way."""
        if self.rules.since(GDR_C2C_SINCE) and self.c2c(proxy) and distance not in ("P2C", "C2C"):
            return "pci"
        return "default"

    def read_refusal(self, gpu: PcieEndpoint) -> str | None:
        """Why NCCL keeps the NIC from reading GPU memory on sends, or None. The default
        (-2, any negative) needs an NVLink peer among the communicator's GPUs, unless the GPU
        is its only one: from 2.19.1 only before sm80, on every GPU before
        (versions.NcclRules.gdr_read_pre_ampere_only)."""
        setting = params.NET_GDR_READ.number(self.environ)
        if setting == 0:
            return f"NCCL_NET_GDR_READ={params.NET_GDR_READ.raw(self.environ)} turns send-side GDR off"
        cc = self.capability(gpu)
        pre_ampere_only = self.rules.gdr_read_pre_ampere_only
        if (setting > 0 or len(self.gpus) == 1 or not self.rules.gdr_read_needs_nvlink
                or pre_ampere_only and (cc is None or cc >= PRE_AMPERE)):
            return None
        if any(self.nvlink_count(gpu, peer) for peer in self.gpus if peer != gpu):
            return None
        nvlink = "no NVLink peer known (NVLink unread)" if self.links_unread() else "no NVLink peer"
        if pre_ampere_only:
            return (f"sm{cc} is older than Ampere and has {nvlink}: NCCL_NET_GDR_READ's default keeps "
                    "send-side GDR off to spare the PCIe bus")
        return (f"the GPU has {nvlink} among the job's GPUs: {self.rules.name}'s NCCL_NET_GDR_READ default "
                "keeps send-side GDR off on every such GPU (before 2.19.1 not only before Ampere)")

    # -- step 3: the NIC loop -----------------------------------------------------------
    @functools.cached_property
    def paths(self) -> Paths:
        """paths.cc ncclTopoComputePaths, "Update paths for NICs": NIC by NIC, GPU by GPU,
        PXN and then the detour of GDR-less paths, each on the paths as updated so far."""
        paths = self.start_paths()
        pxn = self.rules.pxn and not pxn_disabled(self.environ)
        for net in self.nets:
            for gpu in self.gpus:
                if pxn:
                    self.try_pxn(gpu, net, paths)
                path = paths.to_net[gpu][net]
                if self.rank[path.type] < self.rank["PHB"]:
                    gdr = self.gdr(gpu, net, path, False, paths)
                    if not gdr.on:
                        self.detour(gpu, net, paths, gdr.reason)
        return paths

    def try_pxn(self, gpu: PcieEndpoint, net: Net, paths: Paths) -> None:
        """paths.cc ncclTopoComputePaths, PXN, as the release has it (versions.py): the
        relay within NCCL_PXN_C2C's type of the NIC, over NVLink, with GDR to the NIC from
        2.30.3; taken for more bandwidth (2.14.3 on) or where the own path is beyond the
        release's limit (PXB, then PXN from 2.27.6)."""
        # Asked again for every pair, as NCCL does: earlier updates change the answer.
        peer = self.local_gpu(net, paths)
        if peer is None or peer == gpu or not self.nvlink_count(gpu, peer):
            return
        peer_path, own = paths.to_net[peer][net], paths.to_net[gpu][net]
        if self.rank[peer_path.type] > self.rank[self.rules.pxn_level(self.environ)]:
            return
        if self.rules.pxn_relay_needs_gdr and not self.gdr(peer, net, peer_path, True, paths).on:
            return
        beyond = self.rank[own.type] > self.rank[self.rules.pxn_own_limit(self.environ)]
        if beyond or self.rules.pxn_by_bandwidth and peer_path.bw > own.bw:
            paths.set_to_net(gpu, net, PairPath("PXN", min(self.nvlink_gbs(gpu, peer), peer_path.bw), peer))

    def detour(self, gpu: PcieEndpoint, net: Net, paths: Paths, why: str) -> None:
        """addInterStep through the CPU local to the GPU, both ways: GPU to CPU (C2C on
        Grace, else PHB), then CPU to NIC (PHB, or SYS on another CPU)."""
        to_cpu, to_cpu_bw = ("C2C", float("inf")) if self.c2c(gpu) else ("PHB", self.link_gbs(gpu.bdf))
        onward, onward_bw = self.cpu_to_net(gpu, net)
        kind, bw = merge_path_type(to_cpu, onward, self.rank), min(to_cpu_bw, onward_bw)
        before = paths.to_net[gpu][net]
        paths.set_to_net(gpu, net, PairPath(kind, bw, detour=(before.type, why)))
        paths.set_to_gpu(net, gpu, PairPath(kind, bw))


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


def no_nic_decision(gpu: PcieEndpoint, rules: NcclRules | None = None) -> NcclGpuDecision:
    return NcclGpuDecision(gpu=gpu.name, gpu_bdf=gpu.bdf, nic=None, path="none", via_gpu=None,
                           path_type=None, bandwidth_gbs=0.0, gdr_write=False, gdr_read=False,
                           why=("no RDMA NIC that NCCL may use",), candidates=(), nccl_version=version_of(rules))


def socket_decision(gpu: PcieEndpoint, rules: NcclRules, refusal: str) -> NcclGpuDecision:
    """A GPU whose traffic NCCL sends through its socket transport, in host memory
    (:attr:`Machine.refusal`): no RDMA NIC, no GPUDirect either way, for that reason."""
    return dataclasses.replace(no_nic_decision(gpu, rules), path=SOCKET_PATH,
                               why=(refusal, f"receive: {refusal}", f"send: {refusal}"))


def version_of(rules: NcclRules | None) -> str | None:
    """The release whose rules decided, as the report says it; None: unknown (2.30.7's rules)."""
    return dotted(rules.version) if rules is not None and rules.version else None


def channel(machine: Machine, gpu: PcieEndpoint, number: int) -> NcclChannel:
    paths = machine.paths
    net = machine.channel_nic(gpu, paths, number)
    path = paths.to_net[gpu][net]
    return NcclChannel(channel=number, nic=net.ibdev, net=net.label, path_type=path.type,
                       via_gpu=path.via.bdf if path.via else None,
                       gdr_write=machine.gdr(gpu, net, path, False, paths).on,
                       gdr_read=machine.gdr(gpu, net, path, True, paths).on)


def detour_notes(machine: Machine, gpu: PcieEndpoint, chosen: Net) -> list[str]:
    """Why nearer NICs lost: GDR off on their path, so NCCL routed them through the CPU."""
    return [f"{net.label}: GDR is off on its {path.detour[0]} path ({path.detour[1]}), so NCCL routes it "
            f"through the CPU: {path.type} (paths.cc ncclTopoComputePaths)"
            for net, path in machine.paths.to_net[gpu].items() if path.detour and net != chosen]


def gpu_decision(machine: Machine, gpu: PcieEndpoint) -> NcclGpuDecision:
    refused = machine.refusal
    if refused:
        return socket_decision(gpu, machine.rules, refused)
    paths = machine.paths
    nic = machine.channel_nic(gpu, paths)
    if nic is None:
        return no_nic_decision(gpu, machine.rules)
    candidates = tuple(n.label for n in paths.local_nets(gpu))
    path = paths.to_net[gpu][nic]
    write, read = machine.gdr(gpu, nic, path, False, paths), machine.gdr(gpu, nic, path, True, paths)
    why = [f"{nic.label} has the highest bandwidth ({path.bw:.1f} GB/s) and then the lowest path type "
           f"among {', '.join(candidates)}" if len(candidates) > 1 else
           f"{nic.label} is the only NIC with the highest bandwidth ({path.bw:.1f} GB/s) and lowest path type"]
    if nic.members:
        why.append(f"{nic.label} is one virtual NIC fused from {', '.join(nic.members)} "
                   "(topo.cc ncclTopoAutoMerge at NCCL_NET_MERGE_LEVEL; their speeds add up)")
    if path.via is not None:
        why.append(f"PXN: {gpu.name} sends through {path.via.name} over NVLink, "
                   f"{paths.to_net[path.via][nic].type} from there to {nic.label}")
    why += [f"receive: {write.reason}", f"send: {read.reason}"] + detour_notes(machine, gpu, nic)
    why += [machine.facts.placement[d.bdf] for d in (gpu, nic.device) if d.bdf in machine.facts.placement]
    if nic.data_direct_of:
        why.append(data_direct.placement_note(nic.label, nic.ibdev, nic.device.bdf, machine.rules, machine.environ))
    if write.mode == "pci":
        why.append("GDR mode PCI: the GPU reaches its CPU over C2C but this NIC over PCIe, so NCCL forces "
                   "a PCIe mapping of GPU memory (paths.cc ncclTopoCheckGdr)")
    if any(p.type == "SYS" for p in machine.before_pxn[gpu].values()):
        why.append(f"across sockets NCCL counts {machine.inter_cpu.gbs:g} GB/s (topo.cc ncclTopoGetInterCpuBw): "
                   + machine.inter_cpu.source)
    if machine.links_unread():
        why.append(f"NVLink and C2C unknown ({machine.links_unread()}): PXN and P2C are not considered")
    if (machine.capability(gpu) is None and machine.rules.gdr_read_pre_ampere_only
            and machine.rules.gdr_read_needs_nvlink):
        why.append("compute capability unknown (no CUDA facts): the pre-Ampere send rule is not applied")
    mechanism = machine.support.kind(nic.ibdev, gpu.bdf) if write.on else None
    return NcclGpuDecision(gpu=gpu.name, gpu_bdf=gpu.bdf, nic=nic.ibdev, path=path_kind(path),
                           via_gpu=path.via.bdf if path.via else None, path_type=path.type,
                           bandwidth_gbs=round(path.bw, 2), gdr_write=write.on, gdr_read=read.on,
                           why=tuple(why), candidates=candidates, net=nic.label, gdr_mode=write.mode,
                           mechanism=mechanism,
                           mechanism_reason=registration_reason(machine, nic, gpu) if mechanism else "",
                           channels=tuple(channel(machine, gpu, c) for c in range(machine.nets_per_gpu(gpu, paths))),
                           detour_from=path.detour[0] if path.detour else None,
                           nccl_version=version_of(machine.rules),
                           data_direct=nic.device.bdf if nic.data_direct_of else None)


def registration_reason(machine: Machine, net: Net, gpu: PcieEndpoint) -> str:
    """Why NCCL registers the pair's GPU memory as it does; a data-direct device registers
    DMA-BUF through mlx5dv_reg_dmabuf_mr with MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT
    (``net_ib/reg.cc`` ncclIbRegMrDmaBufInternal2, 2.27.3 on) and nothing else: NCCL does not
    fall back to ibv_reg_dmabuf_mr on it."""
    reason = machine.support.registration_reason(net.ibdev, gpu.bdf)
    if net.data_direct_of and machine.support.kind(net.ibdev, gpu.bdf) == "dmabuf":
        return (f"{net.label} is data-direct: {machine.rules.described} registers its DMA-BUF with "
                "mlx5dv_reg_dmabuf_mr(MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT) (net_ib/reg.cc), no fallback; " + reason)
    return reason


def decide(facts: NodeFacts, environ: Mapping[str, str], rules: NcclRules | None = None,
           job_gpus: Collection[str] | None = None) -> tuple[NcclGpuDecision, ...]:
    """The decision for each of the job's GPUs (``job_gpus``: their bus ids, the
    communicator's GPUs on this node; None: every GPU of the node) under ``environ``, the
    environment as NCCL sees it (every NCCL variable is read from it), by the rules of the
    NCCL in use (None: MODELLED's), marked where unread facts could change it."""
    def under(node: NodeFacts) -> tuple[NcclGpuDecision, ...]:
        machine = Machine(node, environ, rules, job_gpus)
        return tuple(gpu_decision(machine, gpu) for gpu in machine.gpus)
    return unread.marked(under(facts), facts, under)

