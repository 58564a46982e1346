"""NVSHMEM's IBGDA (the GPU posts InfiniBand work and rings the NIC's doorbell: what DeepEP's
low-latency kernels use), decided as NVIDIA/nvshmem's source decides it (v3.4.5-0,
``src/modules/transport/ibgda/ibgda.cpp``, ``src/modules/transport/common/env_defs.h``):

- ``NVSHMEM_IB_ENABLE_IBGDA`` (default false) turns the transport on; NVSHMEM reads a boolean
  as false when its first character is 0, N, n, F or f and as true whenever it is set otherwise
  (``env_defs_internal.h`` nvshmemi_getenv_bool).
- A device counts when its name holds ``mlx5`` or ``ibp`` (or ``NVSHMEM_HCA_PREFIX``) and it
  answers as an mlx5 device ("device %s is not enumerated as an mlx5 device. Skipping...").
- GPU memory: DMA-BUF where the GPU reports it and ``NVSHMEM_IB_DISABLE_DMABUF`` is off, else
  nv_peer_mem or nvidia_peermem ("neither nv_peer_mem, or nvidia_peermem detected. Skipping
  transport."; the legacy nv_mem client counts here).
- The doorbell (``NVSHMEM_IBGDA_NIC_HANDLER``, default auto): auto maps a UAR for the GPU
  (mlx5dv_devx_alloc_uar, then ``cudaHostRegister(reg_addr, Portable | Mapped | IoMemory)``:
  ibgda_nic_mem_gpu_map) and falls back, where that is refused, to a CPU thread through
  GDRCopy (``cpu``) where gdrdrv and libgdrapi are there, else through CUDA host memory
  (``cpu_host_memory``, "CPU-assisted IBGDA", 3.4.5 on); ``gpu`` insists, ``cpu`` needs
  GDRCopy.
"""

from __future__ import annotations

from collections.abc import Mapping

from gdrprobe.nccl.gin import (BLAME_NODE, BLAME_SETTING, CPU_PROXY, GPU_INITIATED, NO_GIN, REGISTRATION,
                               REGISTRY_FIX, GinGpu, GinMode, GinNic, GinNode, doorbell_prediction)

NVSHMEM = "NVSHMEM IBGDA"


def nvshmem_bool(environ: Mapping[str, str], name: str, default: bool = False) -> bool:
    """An NVSHMEM boolean as nvshmemi_getenv_bool reads it."""
    value = environ.get(name)
    if value is None:
        return default
    return value[:1] not in ("0", "N", "n", "F", "f")


def ibgda_asked(environ: Mapping[str, str]) -> bool:
    """Whether the job sets any of NVSHMEM's IBGDA variables (the doctor answers for IBGDA only then)."""
    return any(name in environ for name in ("NVSHMEM_IB_ENABLE_IBGDA", "NVSHMEM_IBGDA_NIC_HANDLER"))


def ibgda_mode(node: GinNode, gpu: GinGpu, nic: GinNic) -> GinMode:
    """The doorbell handler NVSHMEM takes for ``gpu`` through ``nic``."""
    environ = node.environ
    asked = "NVSHMEM_IB_ENABLE_IBGDA=" + environ["NVSHMEM_IB_ENABLE_IBGDA"] \
        if nvshmem_bool(environ, "NVSHMEM_IB_ENABLE_IBGDA") else ""
    common = {"gpu": gpu.bdf, "nic": nic.name, "asked": asked, "release": "NVSHMEM 3.4.5"}
    if not asked:
        return GinMode(mode=NO_GIN, blame=BLAME_SETTING, fix="set NVSHMEM_IB_ENABLE_IBGDA=1",
                       reason="NVSHMEM_IB_ENABLE_IBGDA is off (its default): NVSHMEM's IBRC proxy transport "
                              "carries the traffic", **common)
    prefix = environ.get("NVSHMEM_HCA_PREFIX")
    named = prefix in (nic.name or "") if prefix else any(tag in (nic.name or "") for tag in ("mlx5", "ibp"))
    if not named or nic.provider != "mlx5":
        return GinMode(mode=NO_GIN, blame=BLAME_NODE, fix="IBGDA needs an NVIDIA (mlx5) NIC",
                       reason=f"{nic.name} is not an mlx5 device: IBGDA skips it (\"is not enumerated as an mlx5 "
                              "device\", ibgda.cpp nvshmemt_init)", **common)
    dmabuf = bool(gpu.dmabuf) and not nvshmem_bool(environ, "NVSHMEM_IB_DISABLE_DMABUF")
    if not dmabuf and not (node.peer_memory or node.peermem_module):
        return GinMode(mode=NO_GIN, blame=BLAME_NODE, fix="load nvidia-peermem or use DMA-BUF",
                       reason="no DMA-BUF and no peer memory: \"neither nv_peer_mem, or nvidia_peermem detected. "
                              "Skipping transport.\" (ibgda.cpp)", **common)
    handler = environ.get("NVSHMEM_IBGDA_NIC_HANDLER", "auto").strip().lower()
    gdrcopy = node.gdrcopy is not None and not nvshmem_bool(environ, "NVSHMEM_DISABLE_GDRCOPY")
    if handler == "cpu" and not gdrcopy:
        return GinMode(mode=NO_GIN, blame=BLAME_NODE, fix="load gdrdrv (GDRCopy) or use NVSHMEM_IBGDA_NIC_HANDLER=auto",
                       reason="NVSHMEM_IBGDA_NIC_HANDLER=cpu requires GDRCopy, and gdrdrv is not loaded", **common)
    if handler in ("cpu", "cpu_host_memory"):
        return GinMode(mode=CPU_PROXY, backend=handler, blame=BLAME_SETTING, fix="use NVSHMEM_IBGDA_NIC_HANDLER=auto",
                       reason=f"NVSHMEM_IBGDA_NIC_HANDLER={handler}: a CPU thread rings the doorbell", **common)
    mapped, why = doorbell_prediction(node)
    fallback = "cpu (GDRCopy)" if gdrcopy else "cpu_host_memory (CUDA host memory; 3.4.5 on)"
    if mapped is False and handler == "gpu":
        return GinMode(mode=NO_GIN, backend="gpu", blame=BLAME_NODE, registration_decides=True, fix=REGISTRY_FIX,
                       reason=f"NVSHMEM_IBGDA_NIC_HANDLER=gpu, and {why}: ibgda_nic_mem_gpu_map fails and IBGDA "
                              "does not start", **common)
    if mapped is False:
        return GinMode(mode=CPU_PROXY, backend=fallback.split(" ")[0], blame=BLAME_NODE, registration_decides=True,
                       fix=REGISTRY_FIX,
                       reason=f"{why}: NVSHMEM warns \"cudaHostRegister with IoMemory failed\" and falls back to the "
                              f"{fallback} handler", **common)
    return GinMode(mode=GPU_INITIATED, backend="gpu", registration_decides=True,
                   reason=f"the GPU rings the doorbell where {REGISTRATION} succeeds; "
                          f"{'expected' if mapped else 'unknown'}: {why}", **common)
