"""Opening the buffer a :class:`~gdrprobe.memory.spec.MemorySpec` describes, registered on
one side's PD: :func:`open_buffer` releases everything it opened, in order, on every path.
"""

from __future__ import annotations

import contextlib

from gdrprobe.errors import GdrprobeError
from gdrprobe.memory.gpu import PROVIDERS, choose_mechanism, peermem_label
from gdrprobe.memory.nic_probe import probe_nic_dmabuf
from gdrprobe.rdma.mlx5dv import data_direct_path
from gdrprobe.memory.host import HostMemory
from gdrprobe.memory.provider import (ACCESS_REMOTE_READ, LOCAL_ACCESS, PROBE_ACCESS,
                                      MemoryProvider)
from gdrprobe.memory.runtime import open_gpu
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma import verbs
from gdrprobe.sysroot import SysRoot

def nic_numa_node(device: str, root: SysRoot | None = None) -> int:
    """The NUMA node of the RDMA device's PCI function; -1 when unknown or virtual."""
    text = (root or SysRoot()).read(f"/sys/class/infiniband/{device}/device/numa_node")
    try:
        return int(text) if text is not None else -1
    except ValueError:
        return -1


def relaxed_ordering_access(wanted: bool) -> int:
    """IBV_ACCESS_RELAXED_ORDERING where this rdma-core has it, else 0: NCCL registers every
    buffer with it when libibverbs has IBVERBS_1.8 and NCCL_IB_PCI_RELAXED_ORDERING is not 0
    (net_ib ncclIbRelaxedOrderingCapable). It is an optional access flag (libibverbs
    IBV_ACCESS_OPTIONAL_RANGE): a device that cannot relax ordering ignores it."""
    if not wanted:
        return 0
    return int(getattr(verbs.pyverbs().enums, "IBV_ACCESS_RELAXED_ORDERING", 0))


@contextlib.contextmanager
def open_buffer(spec: MemorySpec, endpoint, length: int, remote_write: bool,
                relaxed_ordering: bool = True, read_back: bool = False):
    """A registered provider of `length` bytes on the endpoint's PD, as the spec says;
    writable by the peer only when remote_write; readable by RDMA READ only when read_back
    (NCCL's flush, on a QP of this side's own); with relaxed ordering where wanted and
    available. A GPU provider also carries ``choice_reason``: why this mechanism was used."""
    relaxed = relaxed_ordering_access(relaxed_ordering)
    access = (PROBE_ACCESS if remote_write else LOCAL_ACCESS) | (
        ACCESS_REMOTE_READ if read_back else 0)
    with open_provider(spec, endpoint, length, access, relaxed) as memory:
        yield memory


def register(memory: MemoryProvider, pd, access: int, relaxed: int) -> None:
    """Register with relaxed ordering where asked; a driver that refuses the flag (some
    rxe kernels reject access bits they do not know with EOPNOTSUPP) gets the plain
    registration, and the provider says which one it has."""
    if relaxed:
        try:
            memory.register(pd, access | relaxed)
            memory.relaxed_ordering = True
            return
        except GdrprobeError:
            pass    # the plain registration below says what is wrong, if anything is
    memory.register(pd, access)
    memory.relaxed_ordering = False


@contextlib.contextmanager
def open_provider(spec: MemorySpec, endpoint, length: int, access: int, relaxed: int):
    if spec.kind == "host":
        with HostMemory(length, nic_numa_node(endpoint.device), spec.huge_pages) as memory:
            register(memory, endpoint.pd, access, relaxed)
            yield memory
        return
    with open_gpu_buffer(spec, endpoint, length, access, relaxed) as memory:
        yield memory


@contextlib.contextmanager
def open_gpu_buffer(spec: MemorySpec, endpoint, length: int, access: int, relaxed: int):
    nic = probe_nic_dmabuf(endpoint.pd) if spec.mechanism in ("auto", "dmabuf") else None
    # Say what the NIC allows before the GPU is even opened: on a machine without its GPU runtime the
    # reason still reaches the report, as the error's first piece of evidence.
    _, early_reason = mechanism_for(spec, None, nic)
    try:
        gpu = open_gpu(spec.gpu)
    except GdrprobeError as error:
        error.evidence = "; ".join(x for x in (early_reason, error.evidence) if x)
        raise
    with gpu:
        mechanism, reason = mechanism_for(spec, gpu.attributes, nic)
        # A data-direct NIC registers through its data-direct rung first (memory.rungs).
        extra = {"pcie_mapping": spec.pcie_mapping, "data_direct": data_direct_path(endpoint.device),
                 "face": spec.nic_face, "face_reason": spec.nic_face_reason} if mechanism == "dmabuf" else {}
        with PROVIDERS[mechanism](gpu, length, spec.memory_type, spec.allocation,
                                  **extra) as memory:
            memory.choice_reason = reason
            register(memory, endpoint.pd, access, relaxed)
            yield memory


def mechanism_for(spec: MemorySpec, attributes, nic) -> tuple[str, str]:
    if spec.reason:   # chosen by NCCL's decision for --mem gpu: its rule is the reason
        return spec.mechanism, spec.reason
    if spec.mechanism == "staged":
        return "staged", "staged requested: the bounce through pinned host memory"
    if spec.mechanism == "peermem":
        return "peermem", (f"{peermem_label(attributes)} requested: the GPU address "
                           "registered as is")
    return choose_mechanism(spec.mechanism, attributes, nic, spec.memory_type)
