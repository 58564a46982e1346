"""NCCL's GPU-initiated networking (GIN): for a GPU and the NIC NCCL gives it, whether the GPU
itself rings the NIC's doorbell, a CPU thread does it for the GPU, or there is no GIN at all,
decided as NVIDIA/nccl's source decides it (tags v2.28.7-1 to v2.30.7-1; each rule names its
file and function), with the aws-ofi-nccl plugin's rules on an EFA NIC.

The steps, in NCCL's order:

- **The release.** ``src/gin/`` first appears in 2.28.7 (2.28.3 has none): an older NCCL has
  no GIN.
- **NCCL_GIN_ENABLE** (``src/gin/gin_host.cc``, NCCL_PARAM GinEnable, default 1): 0 and the
  communicator's GIN never connects ("GIN is disabled.", ncclGinConnectOnce; from 2.29.7 the
  type is NONE from the start, setLocalGinType).
- **The GPU.** Volta or newer from 2.30.3 ("Compute Capability (%d) is not sufficient to enable
  GIN", ``src/plugin/gin.cc`` ncclGinInit); the CUDA VMM GPUDirect RDMA attribute
  (``src/init.cc``: globalCuMemGdrSupport, from 2.29.7); no MLO partition (2.30.7,
  ``comm->hasMloPart``).
- **Symmetric memory.** ncclGinConnectOnce needs ``comm->symmetricSupport``, which
  ``src/init.cc`` grants only with ncclCuMemEnable() and NCCL_WIN_ENABLE: NCCL_CUMEM_ENABLE=0
  leaves no GIN ("Communicator does not support symmetric memory!"). Fused NICs
  (NCCL_NET_MERGE_LEVEL's virtual NICs) turn GIN off in 2.29.2-2.30.4 (``globalNicFused``).
- **The backend** (``src/plugin/gin.cc`` from 2.29.7, ``src/plugin/net.cc`` before;
  ``src/transport/net_ib/gin.cc`` ncclGinIbInitType): NCCL_GIN_TYPE -1 (the default) tries
  GDAKI, which counts only the IB devices libmlx5 drives (``IB_PROVIDER_MLX5``:
  mlx5dv_is_supported), then the proxy backend; 3 asks GDAKI only, 2 the proxy only. From
  2.29.7 a backend starts only where GPU memory can be registered (ncclGinIbGdrSupport: "Unable
  to use GIN: Peermem is not supported, nor DMA-BUF."): GDAKI counts nvidia_peermem's module
  file, never the legacy nv_mem client ("GDAKI does not support nv_peer_mem",
  ncclIbPeerMemSupport), the proxy any of NCCL's peer-memory files; DMA-BUF on the first NIC
  counts for both.
- **The doorbell** (GDAKI, ``src/transport/net_ib/gdaki/gin_host_gdaki.cc``
  NCCL_GIN_GDAKI_NIC_HANDLER, default 0: auto): DOCA GPUNetIO allocates a UAR with
  mlx5dv_devx_alloc_uar (non-cached dedicated, else non-cached: doca_gpunetio_high_level.cpp
  create_uar) and asks ``cudaHostRegister(reg_addr, 8, Portable | Mapped | IoMemory)``
  (doca_gpunetio.cpp doca_gpu_verbs_can_gpu_register_uar). Registered, the GPU's SMs ring the
  doorbell; refused, DOCA logs "Enabling CPU proxy mode" and a CPU thread rings it
  (doca_gpu_verbs_export_qp). Only that call answers; the driver's registry
  (``RegistryDwords`` with ``PeerMappingOverride=1``, read back in /proc/driver/nvidia/params)
  is what the NVSHMEM and DeepEP setup guides ask for on x86 (NVIDIA/nvshmem issue 23: the
  x86 regkey), so the doctor predicts from it and ``check --gin`` makes the call.

This module reads nothing: the doctor hands it facts (:mod:`gdrprobe.doctor.facts.gin`).
NVSHMEM's IBGDA: :mod:`gdrprobe.nccl.ibgda`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.versions import (GIN_COMPUTE_GATE_SINCE, GIN_EFA_SINCE, GIN_GDR_GATE_SINCE,
                                    GIN_MLO_GATE_SINCE, GIN_NIC_FUSED_GATE, GIN_SINCE,
                                    GIN_VMM_GATE_SINCE, NcclRules, Version, dotted)

# The modes, as the doctor and nccl-log name them.
GPU_INITIATED = "GPU-initiated"
CPU_PROXY = "CPU proxy"
NO_GIN = "none"
# The backends.
GDAKI, PROXY, EFA_GDA = "GDAKI", "proxy", "EFA-GDA"
# NCCL_GIN_TYPE's values: enum ncclNetDeviceType (src/include/nccl_device/net_device.h);
# 5 is the aws-ofi-nccl plugin's EFA-GDA (its 3rd-party/nccl/cuda/include/nccl/net_device.h).
GIN_TYPE_AUTO, GIN_TYPE_PROXY, GIN_TYPE_GDAKI, GIN_TYPE_EFA_GDA = -1, 2, 3, 5
GIN_TYPE_NAMES = {GIN_TYPE_PROXY: PROXY, GIN_TYPE_GDAKI: GDAKI, 4: "GPI", GIN_TYPE_EFA_GDA: EFA_GDA}
# NCCL_GIN_GDAKI_NIC_HANDLER: enum doca_gpu_dev_verbs_nic_handler (doca_gpunetio_verbs_def.h):
# AUTO 0 (its default), CPU_PROXY 1, GPU_SM_DB 2, GPU_SM_BF 6, GPU_SM_NO_DBR 10.
HANDLER_CPU = 1
GPU_HANDLERS = (2, 6, 10)
# The one registration NCCL (through DOCA) and aws-ofi-nccl make of the doorbell page:
# cuMemHostRegister's flags (cuda.h CU_MEMHOSTREGISTER_PORTABLE, _DEVICEMAP, _IOMEMORY).
REGISTRATION = "cuMemHostRegister(doorbell, PORTABLE | DEVICEMAP | IOMEMORY)"
REGISTRY_KEY = "PeerMappingOverride=1"
REGISTRY_FIX = ("let the NVIDIA driver map other devices' MMIO for the GPU: add "
                "'options nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\"' to "
                "/etc/modprobe.d/nvidia.conf (keep any other RegistryDwords entries in the same "
                "string), rebuild the initramfs (update-initramfs -u, dracut -f) and reboot or "
                "reload the nvidia modules; /proc/driver/nvidia/params then shows it")
GIN_RELEASE_FIX = "use NCCL 2.28.7 or newer (the nvidia-nccl wheel, libnccl2) where the job wants GIN"

# Why a mode is what it is, for the exit code of a job that asked for GIN.
BLAME_SETTING, BLAME_NODE, BLAME_RELEASE = "setting", "node", "release"


@dataclasses.dataclass(frozen=True)
class DriverParams:
    """What /proc/driver/nvidia/params says of the settings the GIN and IBGDA guides ask for."""

    readable: bool = False                 # the file was there and could be read
    registry_dwords: str | None = None     # RegistryDwords' string, quotes removed
    stream_memops: int | None = None       # EnableStreamMemOPs

    @property
    def peer_mapping_override(self) -> bool:
        """PeerMappingOverride=1 among the RegistryDwords (``key=value`` pairs split at ';')."""
        entries = [entry.strip() for entry in (self.registry_dwords or "").split(";")]
        values = [entry.split("=", 1)[1].strip() for entry in entries
                  if "=" in entry and entry.split("=", 1)[0].strip() == "PeerMappingOverride"]
        return bool(values) and _number(values[-1]) == 1

    def describe(self) -> str:
        if not self.readable:
            return "unreadable"
        return (f"RegistryDwords: \"{self.registry_dwords or ''}\"; EnableStreamMemOPs: "
                f"{'unknown' if self.stream_memops is None else self.stream_memops}")


def _number(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class GinGpu:
    bdf: str
    capability: int | None = None          # compute capability x 10
    vmm_gdr: int | None = None             # CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    dmabuf: bool | None = None             # CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
    mlo_part: bool = False


@dataclasses.dataclass(frozen=True)
class GinNic:
    name: str | None                       # the NIC NCCL gives the GPU; None: none
    provider: str | None = None            # "mlx5", "efa", or the kernel driver's name
    provider_source: str = ""              # the evidence
    dmabuf: bool = False                   # NCCL's ibv_reg_dmabuf_mr(fd=-1) probe
    fused: bool = False                    # part of a virtual NIC NCCL fused (name a+b)


@dataclasses.dataclass(frozen=True)
class OfiPlugin:
    """The aws-ofi-nccl plugin the job's NCCL loads, and the libfabric under it."""

    path: str | None = None
    version: Version | None = None
    libfabric_api: tuple[int, int] | None = None   # fi_version(): (major, minor)
    libfabric_source: str = ""
    product_name: str | None = None        # /sys/devices/virtual/dmi/id/product_name


@dataclasses.dataclass(frozen=True)
class GinNode:
    """What the rules read of the node, gathered once."""

    rules: NcclRules
    environ: Mapping[str, str]
    arch: str | None = None                # x86_64, aarch64; None: unknown
    params: DriverParams = DriverParams()
    peermem_module: bool = False           # /sys/module/nvidia_peermem/version
    peer_memory: bool = False              # any file the job's NCCL counts as peer memory
    gdrcopy: str | None = None             # /sys/module/gdrdrv/version
    mlx5_nics: tuple[str, ...] = ()        # every NIC libmlx5 drives (GDAKI's devices)
    verbs_nics: tuple[str, ...] = ()       # every NIC NCCL's IB transport opens (not EFA)
    first_nic_dmabuf: bool = False         # ncclIbDmaBufSupport(0), the GIN gate's
    ofi: OfiPlugin | None = None


@dataclasses.dataclass(frozen=True)
class GinMode:
    """The mode NCCL takes for one GPU and its NIC, and why."""

    gpu: str
    nic: str | None
    mode: str                              # GPU-initiated | CPU proxy | none
    backend: str | None = None             # GDAKI | proxy | EFA-GDA
    reason: str = ""
    fix: str = ""
    blame: str = ""                        # setting | node | release: what keeps it from the GPU
    registration_decides: bool = False     # only the doorbell registration tells (check --gin)
    asked: str = ""                        # how the job asked for GIN explicitly; "" it did not
    release: str = ""                      # whose rules decided


def asked_for_gin(environ: Mapping[str, str]) -> str:
    """How the job asked for GIN explicitly, as NCCL reads its variables: NCCL_GIN_ENABLE set
    to a non-zero value, or NCCL_GIN_TYPE set to a backend (not -1); "" where it did not."""
    asked = []
    if params.GIN_ENABLE.raw(environ) and params.GIN_ENABLE.number(environ) != 0:
        asked.append(f"NCCL_GIN_ENABLE={params.GIN_ENABLE.raw(environ)}")
    if params.GIN_TYPE.number(environ) != GIN_TYPE_AUTO:
        asked.append(f"NCCL_GIN_TYPE={params.GIN_TYPE.raw(environ)}")
    return ", ".join(asked)


def forces_gpu_handler(backend: str, environ: Mapping[str, str]) -> bool:
    """Whether the job insists that the GPU ring the doorbell: NCCL_GIN_GDAKI_NIC_HANDLER one of
    GPU_HANDLERS for GDAKI, NVSHMEM_IBGDA_NIC_HANDLER=gpu for NVSHMEM's IBGDA."""
    if backend == GDAKI:
        return params.GIN_GDAKI_NIC_HANDLER.number(environ) in GPU_HANDLERS
    return environ.get("NVSHMEM_IBGDA_NIC_HANDLER", "auto").strip().lower() == "gpu"


def doorbell_prediction(node: GinNode) -> tuple[bool | None, str]:
    """Whether the driver will map a NIC's doorbell for the GPU, as far as its settings tell:
    True, False, or None (unknown), with why. The registration itself decides."""
    if node.arch not in (None, "x86_64"):
        return True, (f"on {node.arch} the setup guides ask no registry key (NVIDIA/nvshmem issue 23: "
                      "the x86 regkey)")
    if not node.params.readable:
        return None, "/proc/driver/nvidia/params could not be read"
    if node.params.peer_mapping_override:
        return True, f"the driver's RegistryDwords has {REGISTRY_KEY}"
    return False, f"the driver's RegistryDwords lacks {REGISTRY_KEY} (\"{node.params.registry_dwords or ''}\")"


def gin_mode(node: GinNode, gpu: GinGpu, nic: GinNic) -> GinMode:
    """The mode NCCL takes for ``gpu`` through ``nic`` (the NIC the doctor's NCCL decision names)."""
    common = {"gpu": gpu.bdf, "nic": nic.name, "asked": asked_for_gin(node.environ),
              "release": node.rules.described}
    refusal = _refusal(node, gpu, nic)
    if refusal is not None:
        reason, fix, blame = refusal
        return GinMode(mode=NO_GIN, reason=reason, fix=fix, blame=blame, **common)
    if nic.provider == "efa":
        return _efa(node, gpu, nic, common)
    return _backend(node, nic, common)


def _refusal(node: GinNode, gpu: GinGpu, nic: GinNic) -> tuple[str, str, str] | None:
    """(reason, fix, blame) where GIN is off whatever the NIC, else None."""
    rules, environ = node.rules, node.environ
    if not rules.since(GIN_SINCE):
        return (f"{rules.name} has no GIN: src/gin/ first appears in NCCL {dotted(GIN_SINCE)}",
                GIN_RELEASE_FIX, BLAME_RELEASE)
    if params.GIN_ENABLE.number(environ) == 0:
        return (f"NCCL_GIN_ENABLE={params.GIN_ENABLE.raw(environ)} turns GIN off: NCCL logs \"GIN is "
                "disabled.\" (src/gin/gin_host.cc ncclGinConnectOnce) and a device communicator that "
                "asks for GIN fails", "unset NCCL_GIN_ENABLE (its default, 1, allows GIN)", BLAME_SETTING)
    if rules.since(GIN_COMPUTE_GATE_SINCE) and gpu.capability is not None and gpu.capability < 70:
        return (f"compute capability {gpu.capability / 10:.1f}: NCCL needs Volta (7.0) or newer for GIN "
                "(src/plugin/gin.cc ncclGinInit)", "", BLAME_NODE)
    cumem = rules.gpu_allocation(environ)
    if cumem != "vmm":
        set_by = params.CUMEM_ENABLE.raw(environ)
        why = f"NCCL_CUMEM_ENABLE={set_by}" if set_by is not None else rules.cumem_default
        return (f"cuMem off ({why}): NCCL grants symmetric memory only with ncclCuMemEnable() "
                "(src/init.cc symmetricSupport), and GIN connects only on a communicator that has it "
                "(\"Communicator does not support symmetric memory!\")",
                "unset NCCL_CUMEM_ENABLE (cuMem is on by default where the driver supports it)",
                BLAME_SETTING if set_by is not None else BLAME_RELEASE)
    if params.WIN_ENABLE.number(environ) == 0:
        return ("NCCL_WIN_ENABLE=0: no symmetric memory windows (src/init.cc symmetricSupport), so GIN "
                "never connects", "unset NCCL_WIN_ENABLE", BLAME_SETTING)
    if rules.since(GIN_VMM_GATE_SINCE) and gpu.vmm_gdr == 0:
        return ("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0 on this GPU: NCCL turns "
                "GIN off for the communicator (src/init.cc globalCuMemGdrSupport)",
                "GPUDirect RDMA of cuMem memory needs a driver and GPU that support it (R520+, a "
                "datacenter GPU)", BLAME_NODE)
    if rules.since(GIN_NIC_FUSED_GATE[0]) and not rules.since(GIN_NIC_FUSED_GATE[1]) and nic.fused:
        return (f"{nic.name} is a virtual NIC NCCL fused from several ports, and {rules.name} turns GIN "
                "off where a rank's NICs are fused (src/init.cc globalNicFused; gone in 2.30.7)",
                "set NCCL_NET_MERGE_LEVEL=LOC (no fusion) or use NCCL 2.30.7+", BLAME_SETTING)
    if rules.since(GIN_MLO_GATE_SINCE) and gpu.mlo_part:
        return ("the GPU is an MLO partition: NCCL 2.30.7 gives a communicator with one no GIN "
                "(src/init.cc hasMloPart)", "", BLAME_NODE)
    return None


def _gdr_gate(node: GinNode, gdaki: bool) -> str:
    """Why a backend cannot register GPU memory (ncclGinIbGdrSupport, 2.29.7+); "" where it can."""
    if not node.rules.since(GIN_GDR_GATE_SINCE):
        return ""
    peer = node.peermem_module if gdaki else node.peer_memory
    if peer or node.first_nic_dmabuf:
        return ""
    legacy = (" (GDAKI counts only /sys/module/nvidia_peermem/version, never the legacy nv_mem "
              "client: src/transport/net_ib/gin.cc ncclIbPeerMemSupport)") if gdaki and node.peer_memory else ""
    return ("\"Unable to use GIN: Peermem is not supported, nor DMA-BUF.\" (src/transport/net_ib/gin.cc "
            f"ncclGinIbGdrSupport){legacy}")


def _backend(node: GinNode, nic: GinNic, common: dict) -> GinMode:
    gin_type = params.GIN_TYPE.number(node.environ)
    named = f"NCCL_GIN_TYPE={params.GIN_TYPE.raw(node.environ)}"
    if gin_type not in (GIN_TYPE_AUTO, GIN_TYPE_GDAKI, GIN_TYPE_PROXY):
        return GinMode(mode=NO_GIN, blame=BLAME_SETTING, fix="unset NCCL_GIN_TYPE",
                       reason=f"{named} ({GIN_TYPE_NAMES.get(gin_type, 'no backend')}) matches none of the "
                              "GIN backends NCCL has on this NIC (src/plugin/gin.cc ncclGinPluginAssignToComm)",
                       **common)
    no_devices = "\"No GIN-capable devices found.\" or \"GIN not supported.\" where a communicator asks for GIN"
    if gin_type != GIN_TYPE_PROXY:
        gdaki_why = ("" if node.mlx5_nics else
                     "no NIC here is driven by libmlx5, and GDAKI counts only those "
                     "(src/transport/net_ib/gin.cc ncclGinIbGdakiInitOnce: IB_PROVIDER_MLX5)") or _gdr_gate(node, True)
        if not gdaki_why:
            return _gdaki(node, nic, common)
        if gin_type == GIN_TYPE_GDAKI:
            return GinMode(mode=NO_GIN, blame=BLAME_NODE, fix=_memory_fix() if "Peermem" in gdaki_why else "",
                           reason=f"{named} asks GDAKI only, and {gdaki_why}: NCCL logs {no_devices}", **common)
    proxy_why = ("" if node.verbs_nics else "NCCL's IB transport has no device here") or _gdr_gate(node, False)
    if proxy_why:
        why = proxy_why if gin_type == GIN_TYPE_PROXY else f"{gdaki_why}; for the proxy backend, {proxy_why}"
        return GinMode(mode=NO_GIN, blame=BLAME_NODE, fix=_memory_fix() if "Peermem" in why else "",
                       reason=f"{why}: NCCL logs {no_devices}", **common)
    if gin_type == GIN_TYPE_PROXY:
        because, blame, fix = f"{named} asks the proxy backend", BLAME_SETTING, "unset NCCL_GIN_TYPE"
    else:
        because, blame = gdaki_why, BLAME_NODE
        fix = _memory_fix() if "Peermem" in gdaki_why else ""
    return GinMode(mode=CPU_PROXY, backend=PROXY, blame=blame, fix=fix,
                   reason=f"{because}: NCCL's GIN proxy backend, where the GPU writes descriptors to host "
                          "memory and a CPU thread posts them (src/gin/gin_host_proxy.cc)", **common)


def _memory_fix() -> str:
    return ("load nvidia-peermem (modprobe nvidia-peermem; the deprecated nv_peer_mem does not count for "
            "GDAKI) or use DMA-BUF (the open GPU kernel modules, Linux 5.12+)")


def _gdaki(node: GinNode, nic: GinNic, common: dict) -> GinMode:
    device = nic.name if nic.name in node.mlx5_nics else node.mlx5_nics[0]
    common = {**common, "nic": device}
    elsewhere = "" if device == nic.name else f" (GDAKI uses {device}: {nic.name} is not an mlx5 device)"
    handler = params.GIN_GDAKI_NIC_HANDLER.number(node.environ)
    if handler == HANDLER_CPU:
        return GinMode(mode=CPU_PROXY, backend=GDAKI, blame=BLAME_SETTING, fix="unset NCCL_GIN_GDAKI_NIC_HANDLER",
                       reason=f"GDAKI{elsewhere} with NCCL_GIN_GDAKI_NIC_HANDLER=1: DOCA GPUNetIO's CPU proxy "
                              "rings the doorbell for the GPU", **common)
    mapped, why = doorbell_prediction(node)
    forced = handler in GPU_HANDLERS
    if mapped is False and forced:
        return GinMode(mode=NO_GIN, backend=GDAKI, blame=BLAME_NODE, registration_decides=True, fix=REGISTRY_FIX,
                       reason=f"GDAKI{elsewhere} with NCCL_GIN_GDAKI_NIC_HANDLER={handler} makes the GPU ring the "
                              f"doorbell, and {why}: DOCA fails the QP export (\"Can't export UAR to GPU.\") and "
                              "the communicator's GIN context with it", **common)
    if mapped is False:
        return GinMode(mode=CPU_PROXY, backend=GDAKI, blame=BLAME_NODE, registration_decides=True, fix=REGISTRY_FIX,
                       reason=f"GDAKI{elsewhere}, but {why}: DOCA GPUNetIO then logs \"Enabling CPU proxy mode\" "
                              "and a CPU thread rings the doorbell (doca_gpunetio.cpp doca_gpu_verbs_export_qp)",
                       **common)
    expected = "expected: " if mapped else "unknown: "
    return GinMode(mode=GPU_INITIATED, backend=GDAKI, registration_decides=True,
                   reason=f"GDAKI{elsewhere}: the GPU rings the doorbell where {REGISTRATION} succeeds; "
                          f"{expected}{why}", **common)


def _efa(node: GinNode, gpu: GinGpu, nic: GinNic, common: dict) -> GinMode:
    """GIN on an EFA NIC comes from the aws-ofi-nccl plugin (doc/gin-getting-started.md, 1.21):
    NCCL 2.31.2+, GDRCopy 2.5+, proxy mode by default; EFA-GDA (the GPU rings EFA's doorbell)
    with NCCL_GIN_TYPE=5, libfabric 2.5+ at run time (nccl_ofi_gin_gdaki.h
    nccl_ofi_gin_gdaki_capable; the guide asks 2.6.0), DMA-BUF, and an instance type whose
    platform entry has the hardware completion counter (platform-aws.cpp: p5en, p6-b200,
    p6-b300; OFI_NCCL_GDAKI_EFA_HW_COUNTER overrides); its doorbell and SQ are mapped with
    cuMemHostRegister(IOMEMORY | DEVICEMAP) (gdaki_mmio_region::map), with no CPU fallback."""
    plugin, rules, environ = node.ofi or OfiPlugin(), node.rules, node.environ
    need = []
    if plugin.version is None or plugin.version < (1, 21, 0):
        found = f"aws-ofi-nccl {dotted(plugin.version)}" if plugin.version else "no aws-ofi-nccl plugin found"
        need.append(f"aws-ofi-nccl 1.21 or newer ({found})")
    if not rules.since(GIN_EFA_SINCE):
        need.append(f"NCCL {dotted(GIN_EFA_SINCE)} or newer ({rules.described})")
    if not node.gdrcopy or _dotted_tuple(node.gdrcopy) < (2, 5):
        need.append(f"GDRCopy 2.5 or newer (gdrdrv {node.gdrcopy or 'not loaded'})")
    if need:
        return GinMode(mode=NO_GIN, blame=BLAME_NODE, fix="use " + ", ".join(need),
                       reason=f"GIN on EFA comes from the aws-ofi-nccl plugin, which needs {', '.join(need)} "
                              "(aws-ofi-nccl doc/gin-getting-started.md)", **common)
    if params.GIN_TYPE.number(environ) != GIN_TYPE_EFA_GDA:
        return GinMode(mode=CPU_PROXY, backend=PROXY, blame=BLAME_SETTING, fix="set NCCL_GIN_TYPE=5 for EFA-GDA",
                       reason="the plugin's proxy mode, NCCL's default on EFA (aws-ofi-nccl "
                              "doc/gin-getting-started.md): a CPU thread posts the GPU's operations", **common)
    missing = _efa_gda_missing(node, gpu, nic)
    if missing:
        return GinMode(mode=NO_GIN, backend=EFA_GDA, blame=BLAME_NODE, fix="; ".join(fix for _, fix in missing),
                       reason="NCCL_GIN_TYPE=5 asks EFA-GDA, which needs " + "; ".join(why for why, _ in missing)
                              + ": the plugin's createContext fails (\"gin GDAKI: createContext ...\")", **common)
    mapped, why = doorbell_prediction(node)
    if mapped is False:
        return GinMode(mode=NO_GIN, backend=EFA_GDA, blame=BLAME_NODE, registration_decides=True, fix=REGISTRY_FIX,
                       reason=f"EFA-GDA maps EFA's doorbell with cuMemHostRegister(IOMEMORY | DEVICEMAP) and has no "
                              f"CPU fallback, and {why}", **common)
    return GinMode(mode=GPU_INITIATED, backend=EFA_GDA, registration_decides=True,
                   reason=f"EFA-GDA: the GPU rings EFA's doorbell where the driver maps it; {why}", **common)


def _efa_gda_missing(node: GinNode, gpu: GinGpu, nic: GinNic) -> list[tuple[str, str]]:
    plugin, environ = node.ofi or OfiPlugin(), node.environ
    missing = []
    if plugin.libfabric_api is None or plugin.libfabric_api < (2, 5):
        found = f"{plugin.libfabric_api[0]}.{plugin.libfabric_api[1]}" if plugin.libfabric_api else "unknown"
        missing.append((f"libfabric 2.5+ at run time (fi_version() {found}{plugin.libfabric_source})",
                        "install libfabric 2.6.0 or newer (the EFA installer), as the plugin's guide asks"))
    override = environ.get("OFI_NCCL_GDAKI_EFA_HW_COUNTER", "auto").strip().lower()
    product = (plugin.product_name or "").strip()
    declared = product.startswith(("p5en", "p6-b200", "p6-b300"))
    if override == "off" or (override != "on" and not declared):
        missing.append((f"an instance type with EFA's hardware completion counter (p5en, p6-b200, p6-b300; "
                        f"this is {product or 'unknown'}, OFI_NCCL_GDAKI_EFA_HW_COUNTER={override})",
                        "run EFA-GDA on P5en, P6-B200 or P6-B300, or use the proxy mode (unset NCCL_GIN_TYPE)"))
    if not (nic.dmabuf and gpu.dmabuf):
        missing.append(("DMA-BUF on the GPU and the NIC (nccl_ofi_dmabuf_viable)",
                        "use the open GPU kernel modules on Linux 5.12+"))
    return missing


def _dotted_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.strip().split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)
