"""The GPU's side of check --gin: the registration NCCL's GIN makes of a NIC's doorbell page
(NVIDIA/nccl v2.30.7 ``src/transport/net_ib/gdaki/doca-gpunetio/src``: a UAR from
``mlx5dv_devx_alloc_uar`` in DOCA GPUNetIO's order, then ``cudaHostRegister(reg_addr, 8,
Portable | Mapped | IoMemory)`` and ``cudaHostGetDevicePointer``), made through libmlx5
(:mod:`gdrprobe.rdma.mlx5dv`) and the CUDA driver
(:class:`gdrprobe.memory.cuda_driver.IoMemoryMapping`), everything unregistered, freed and
closed again, after an error or a signal too. NVIDIA-only: GIN and IBGDA are NCCL's and
NVSHMEM's. What the answer means for a job: :mod:`gdrprobe.campaign.gin`."""

from __future__ import annotations

import contextlib
import dataclasses

from gdrprobe.errors import GdrprobeError
from gdrprobe.report.gin import MAPPED, NOT_RUN, REFUSED

DOORBELL_BYTES = 8      # DOCA_VERBS_DB_UAR_SIZE (doca_internal.hpp): what DOCA registers


@dataclasses.dataclass(frozen=True)
class Registration:
    """What the calls gave: the outcome, the UAR page, each call with its result, and why
    nothing was registered where the step could not run."""

    outcome: str
    doorbell: str = ""
    calls: tuple[str, ...] = ()
    why: str = ""


def register_doorbell(gpu: str, nic: str, libmlx5: str | None = None, opener=None) -> Registration:
    """NCCL's registration of a doorbell page of ``nic`` for ``gpu`` (an ordinal or bus id).
    ``opener(library, nic)``: a context manager giving the device's ibv_context
    (:func:`gdrprobe.rdma.mlx5dv.opened` unless a test of binding shapes replaces it)."""
    from gdrprobe.memory.cuda import open_gpu
    from gdrprobe.memory.cuda_driver import IoMemoryMapping
    from gdrprobe.rdma import mlx5dv

    try:
        library = mlx5dv.loaded(libmlx5 or mlx5dv.LIBMLX5)
    except mlx5dv.Unavailable as error:
        return Registration(NOT_RUN, why=str(error))
    try:
        with contextlib.ExitStack() as stack:
            device = stack.enter_context(open_gpu(gpu))
            context = stack.enter_context((opener or mlx5dv.opened)(library, nic))
            doorbell = stack.enter_context(mlx5dv.alloc_doorbell(library, context))
            page = (f"{nic}'s UAR page {doorbell.page_id} ({doorbell.kind}"
                    + (f"; {'; '.join(doorbell.refused)}" if doorbell.refused else "") + ")")
            device.activate()
            mapping = stack.enter_context(IoMemoryMapping(device.bindings, doorbell.address, DOORBELL_BYTES))
            outcome = MAPPED if mapping.device_pointer is not None else REFUSED
            stack.close()
            return Registration(outcome, page, tuple(mapping.calls))
    except mlx5dv.NoDoorbell as error:
        return Registration(NOT_RUN, why=str(error))
    except GdrprobeError as error:
        return Registration(NOT_RUN, why="; ".join(part for part in (error.cause, error.evidence) if part))
