"""What GIN's rules (:mod:`gdrprobe.nccl.gin`, :mod:`gdrprobe.nccl.ibgda`) read of the
machine, gathered once per doctor run:

- ``/proc/driver/nvidia/params``: the driver's ``RegistryDwords`` string and
  ``EnableStreamMemOPs`` (the open-gpu-kernel-modules driver prints every module parameter
  there as ``Name: value``, strings in double quotes);
- the architecture the NVIDIA driver was built for (its version line names it: "... for
  x86_64"), else /proc/cpuinfo's (``vendor_id`` on x86, ``CPU implementer`` on Arm);
- ``/sys/module/nvidia_peermem/version`` and NCCL's peer-memory files (the memory paths the
  doctor already read), ``/sys/module/gdrdrv/version`` (GDRCopy);
- per NIC, whether libmlx5 drives it: NCCL's data-direct sequence records mlx5dv_is_supported
  where it ran, else the kernel driver bound to the NIC's PCI function
  (``/sys/class/infiniband/DEV/device/driver``: mlx5_core, efa, ...);
- on an EFA node, the aws-ofi-nccl plugin the job's NCCL loads (NCCL_NET_PLUGIN, else
  ``libnccl-net.so``, then ``libnccl-net-ofi.so``, found as the dynamic loader finds them;
  its version from the ``aws-ofi-nccl X.Y.Z`` string its configure script builds in), the
  libfabric ``fi_version()`` (live: :mod:`gdrprobe.rdma.libfabric`) and the instance type
  (``/sys/devices/virtual/dmi/id/product_name``, which the plugin matches).

Live facts a replay cannot read from files (libfabric's answer, the plugin's version read
past a capture's first MiB) are written to ``gin.json`` in the capture.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any
from collections.abc import Mapping

from gdrprobe.doctor.facts.dynamic_loader import places, resolve
from gdrprobe.doctor.facts.nccl_library import version_in_bytes
from gdrprobe.nccl.env import net_plugin_files, net_plugin_names
from gdrprobe.nccl.gin import DriverParams, GinGpu, GinNic, GinNode, OfiPlugin
from gdrprobe.nccl.versions import parse_version
from gdrprobe.sysroot import SysRoot

PARAMS_FILE = "/proc/driver/nvidia/params"
PEERMEM_MODULE_FILE = "/sys/module/nvidia_peermem/version"
GDRDRV_VERSION = "/sys/module/gdrdrv/version"
PRODUCT_NAME = "/sys/devices/virtual/dmi/id/product_name"
CPUINFO = "/proc/cpuinfo"
OFI_MARK = b"aws-ofi-nccl "
DEFAULT_PLUGINS = ("libnccl-net.so", "libnccl-net-ofi.so")
_PARAM = re.compile(r"^\s*(\w+)\s*:\s*(.*?)\s*$")


def driver_params(root: SysRoot) -> DriverParams:
    text = root.read(PARAMS_FILE)
    if text is None:
        return DriverParams()
    values = {}
    for line in text.splitlines():
        match = _PARAM.match(line)
        if match:
            values[match.group(1)] = match.group(2)
    registry = values.get("RegistryDwords")
    if registry is not None and len(registry) >= 2 and registry[0] == registry[-1] == '"':
        registry = registry[1:-1]
    memops = values.get("EnableStreamMemOPs")
    return DriverParams(readable=True, registry_dwords=registry,
                        stream_memops=int(memops) if memops is not None and memops.isdigit() else None)


def architecture(root: SysRoot, driver_line: str | None) -> str | None:
    """x86_64 or aarch64, as the NVIDIA driver's build or /proc/cpuinfo says; None: unknown."""
    match = re.search(r"\bfor (x86_64|aarch64|ppc64le)\b", driver_line or "")
    if match:
        return match.group(1)
    cpuinfo = root.read(CPUINFO) or ""
    if re.search(r"^vendor_id\s*:", cpuinfo, re.MULTILINE):
        return "x86_64"
    if re.search(r"^CPU implementer\s*:", cpuinfo, re.MULTILINE):
        return "aarch64"
    return None


def nic_provider(root: SysRoot, name: str, data_direct: Mapping[str, Any]) -> tuple[str | None, str]:
    """("mlx5" | "efa" | another kernel driver | None, the evidence) for one RDMA device."""
    probe = data_direct.get(name) or {}
    if "mlx5" in probe:
        return ("mlx5" if probe["mlx5"] else None), f"mlx5dv_is_supported({name}) returned {bool(probe['mlx5'])}"
    link = posixpath.join(root.realpath(f"/sys/class/infiniband/{name}/device"), "driver")
    target = root.readlink(link)
    if target is None:
        return None, f"{link}: absent"
    driver = posixpath.basename(target)
    provider = {"mlx5_core": "mlx5", "efa": "efa"}.get(driver, driver)
    return provider, f"{link} -> {driver}"


def find_ofi_plugin(root: SysRoot, environ: Mapping[str, str]) -> str | None:
    """The net plugin library NCCL dlopens (src/plugin/plugin_open.cc: NCCL_NET_PLUGIN's
    names as libnccl-net-<name>.so, or a path; else libnccl-net.so), as the loader finds it."""
    tried = places(root, None, None, environ)
    for name in net_plugin_names(environ) or list(DEFAULT_PLUGINS):
        for soname in net_plugin_files(name):
            if "/" in soname:
                if root.exists(soname):
                    return soname
                continue
            found = resolve(root, soname, tried)
            if found:
                return found[0][0]
    return None


def ofi_plugin_facts(root: SysRoot, environ: Mapping[str, str]) -> dict[str, Any]:
    """The plugin's path and version (live: read now), for gin.json."""
    path = find_ofi_plugin(root, environ)
    version = version_in_bytes(root, path, OFI_MARK) if path else None
    return {"path": path, "version": version}


def collect_gin_facts(root: SysRoot, environ: Mapping[str, str], efa: bool) -> dict[str, Any]:
    """What only a live process can answer: libfabric's fi_version() and the plugin's
    version read from its bytes; asked only on an EFA node."""
    if not efa:
        return {}
    from gdrprobe.rdma.libfabric import fi_version

    return {"ofi_plugin": ofi_plugin_facts(root, environ), "libfabric": fi_version()}


def ofi_plugin(root: SysRoot, live: Mapping[str, Any]) -> OfiPlugin:
    plugin = live.get("ofi_plugin") or {}
    fabric = live.get("libfabric") or {}
    api = fabric.get("api")
    product = root.read(PRODUCT_NAME)
    return OfiPlugin(path=plugin.get("path"), version=parse_version(plugin.get("version")),
                     libfabric_api=tuple(api) if api else None,
                     libfabric_source=f", {fabric['path']}" if fabric.get("path") else
                     (f": {fabric['error']}" if fabric.get("error") else ""),
                     product_name=product.strip() if product else None)


def gin_node(ctx, live: Mapping[str, Any]) -> GinNode:
    """The node's facts for GIN's rules; ``ctx``: the doctor's context."""
    root = ctx.root
    data_direct = ((ctx.nic_facts or {}).get("data_direct") or {}).get("devices") or {}
    providers = {nic.name: nic_provider(root, nic.name, data_direct)[0] for nic in ctx.topology.nics}
    paths = ctx.memory_paths
    nics = [nic.name for nic in ctx.topology.nics]
    gdrdrv = root.read(GDRDRV_VERSION)
    return GinNode(
        rules=ctx.nccl_rules, environ=ctx.environ, arch=architecture(root, ctx.driver_line),
        params=driver_params(root), peermem_module=root.exists(PEERMEM_MODULE_FILE),
        peer_memory=paths.peermem_file is not None, gdrcopy=gdrdrv.strip() if gdrdrv else None,
        mlx5_nics=tuple(name for name in nics if providers[name] == "mlx5"),
        verbs_nics=tuple(name for name in nics if providers[name] != "efa"),
        first_nic_dmabuf=bool(nics) and paths.nic_half(nics[0]).supported,
        ofi=ofi_plugin(root, live) if "efa" in providers.values() else None)


def gin_gpu(ctx, bdf: str) -> GinGpu:
    """One GPU as GIN's rules read it: NCCL's facts of it (compute capability, MLO partition)
    and the CUDA driver's VMM GPUDirect and DMA-BUF attributes."""
    facts = ctx.nccl_node.gpu(bdf)
    cuda = ctx.cuda_facts if ctx.cuda_facts and "error" not in ctx.cuda_facts else {}
    attributes = next((gpu for gpu in cuda.get("gpus", []) if gpu.get("pci_bus_id") == bdf), {})
    dmabuf = attributes.get("dma_buf_supported")
    return GinGpu(bdf=bdf, capability=facts.capability,
                  vmm_gdr=attributes.get("gpu_direct_rdma_with_cuda_vmm_supported"),
                  dmabuf=None if dmabuf is None else bool(dmabuf), mlo_part=facts.mlo_part is not None)


def gin_nic(ctx, decision) -> GinNic:
    """The NIC the doctor's NCCL decision gives a GPU, as GIN's rules read it."""
    name = decision.nic
    if name is None:
        return GinNic(name=None)
    data_direct = ((ctx.nic_facts or {}).get("data_direct") or {}).get("devices") or {}
    provider, source = nic_provider(ctx.root, name, data_direct)
    half = ctx.memory_paths.nic_half(name)
    return GinNic(name=name, provider=provider, provider_source=source, dmabuf=half.supported,
                  fused="+" in (decision.net or ""))
