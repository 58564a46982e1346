"""The ids of the doctor's findings, named once. The checks that produce a finding and every
reader that acts on one (the verdict, a server choosing what to send its clients) use these
names, so an id cannot be renamed on one side only. The strings themselves are part of what
users and peers see: the JSON report, ``gdrprobe doctor``'s text, the findings a server sends.

An id is ``<group>.<what>``; the group is the flowchart group the finding is shown under.
Findings about one device or variable carry its name in the middle (``gpu.0000:3b:00.0.bar1``),
made by the functions below.
"""

from __future__ import annotations

# ---- the groups, in the order the doctor runs them (gdrprobe.doctor.runner) -------------
TOPOLOGY = "topology"
STACK = "stack"
GPU = "gpu"
MEMLOCK = "memlock"
IOMMU = "iommu"
ACS = "acs"
NCCL = "nccl"
NIC = "nic"
GIN = "gin"
ACCESS = "access"

# ---- topology: where the GPUs and NICs sit --------------------------------------------
TOPOLOGY_DEVICES = "topology.devices"
TOPOLOGY_SOFTWARE_NIC = "topology.software_nic"
TOPOLOGY_VM = "topology.vm"
TOPOLOGY_MATRIX = "topology.matrix"
TOPOLOGY_NVML = "topology.nvml"
TOPOLOGY_NCCL_LEVEL = "topology.nccl_level"
TOPOLOGY_DISTANCE = "topology.distance"
TOPOLOGY_NCCL_FILE = "topology.nccl_file"
TOPOLOGY_RAILS = "topology.rails"

# ---- stack: the kernel path to GPU memory ---------------------------------------------
STACK_DRIVER = "stack.driver"
STACK_KERNEL = "stack.kernel"
STACK_CUDA_DRIVER = "stack.cuda_driver"
STACK_OFED = "stack.ofed"
STACK_PATH = "stack.path"
STACK_PEERMEM = "stack.peermem"
STACK_NV_PEER_MEM = "stack.nv_peer_mem"
STACK_GDRCOPY = "stack.gdrcopy"

# ---- gpu: the GPU runtime's, the CUDA driver's and NVML's facts -------------------------
GPU_NVML = "gpu.nvml"


def gpu_runtime(key: str) -> str:
    """Whether the node's GPU runtime lists the GPUs the bus holds: gpu.cuda, gpu.rocm (a
    runtime's key, gdrprobe.memory.runtime)."""
    return f"{GPU}.{key}"


GPU_CUDA = gpu_runtime("cuda")
GPU_ROCM = gpu_runtime("rocm")

# ---- memlock, iommu, acs ----------------------------------------------------------------
MEMLOCK_LIMIT = "memlock.limit"
MEMLOCK_JOBS = "memlock.jobs"
MEMLOCK_CAP_IPC_LOCK = "memlock.cap_ipc_lock"
MEMLOCK_CONTAINER = "memlock.container"
IOMMU_CMDLINE = "iommu.cmdline"
IOMMU_DOMAIN = "iommu.domain"
ACS_BRIDGE = "acs.bridge"
ACS_ATS = "acs.ats"

# ---- nccl: NCCL's variables and its decision per GPU -----------------------------------
NCCL_ENV = "nccl.env"
NCCL_LIBRARY = "nccl.library"
NCCL_DATA_DIRECT = "nccl.data_direct"

# ---- nic: devices, ports, verbs nodes -----------------------------------------------------
NIC_SYSFS = "nic.sysfs"
NIC_DEVICES = "nic.devices"
NIC_PORTS = "nic.ports"
NIC_DEV_INFINIBAND = "nic.dev_infiniband"
NIC_MLX5_SCATTER_TO_CQE = "nic.mlx5_scatter_to_cqe"

# ---- gin: GPU-initiated networking (NCCL's GIN, NVSHMEM's IBGDA) -----------------------
GIN_DRIVER_PARAMS = "gin.driver_params"
GIN_NODE = "gin.node"

# ---- the runner's own ---------------------------------------------------------------------
ACCESS_DENIED = "access.denied"


def crashed(group: str) -> str:
    """A check of ``group`` raised: a gdrprobe bug, reported as a finding."""
    return f"{group}.crashed"


def is_crashed(finding_id: str) -> bool:
    return finding_id.endswith(".crashed")


def gpu_bar1(bdf: str) -> str:
    return f"gpu.{bdf}.bar1"


def is_gpu_bar1(finding_id: str) -> bool:
    return finding_id.startswith(GPU + ".") and finding_id.endswith(".bar1")


def gpu_rdma(bdf: str) -> str:
    return f"gpu.{bdf}.rdma"


def gpu_dmabuf(bdf: str) -> str:
    return f"gpu.{bdf}.dmabuf"


def gpu_write_ordering(bdf: str) -> str:
    return f"gpu.{bdf}.write_ordering"


def nccl_variable(name: str) -> str:
    """A finding about one NCCL variable: NCCL_IB_HCA -> nccl.ib_hca."""
    return "nccl." + name.lower().removeprefix("nccl_")


def nccl_gpu(bdf: str) -> str:
    """NCCL's decision for one GPU."""
    return f"nccl.gpu.{bdf}"


def nccl_data_direct_domain(bdf: str) -> str:
    """A GPU whose NCCL network device is a data-direct one in another PCI domain."""
    return f"nccl.gpu.{bdf}.data_direct_domain"


def gin_gpu(bdf: str) -> str:
    """The GIN mode NCCL takes for one GPU."""
    return f"gin.gpu.{bdf}"


def gin_nvshmem(bdf: str) -> str:
    """The doorbell handler NVSHMEM's IBGDA takes for one GPU."""
    return f"gin.nvshmem.{bdf}"


def nic_port(device: str, port: str, what: str) -> str:
    """A finding about one port: nic.mlx5_0.port1.state, nic.mlx5_0.port1.roce_v2_gid."""
    return f"nic.{device}.port{port}.{what}"


def in_group(finding_id: str, group: str) -> bool:
    return finding_id.startswith(group + ".")
