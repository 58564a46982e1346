"""``check --gin``: whether this GPU can ring this NIC's doorbell, as NCCL's GIN asks it
(gdrprobe.campaign.gin makes the calls; gdrprobe.nccl.gin holds NCCL's rules)."""

from __future__ import annotations

import dataclasses

# The outcomes of the registration.
MAPPED = "mapped"            # cuMemHostRegister(IOMEMORY) and cuMemHostGetDevicePointer succeeded
REFUSED = "refused"          # the driver refused to map the NIC's MMIO for the GPU
NOT_RUN = "not run"          # no doorbell to register here (no mlx5 device, no libmlx5, no CUDA)

CAN_MAP = "the GPU can map the NIC's doorbell"
CPU_PROXIED = "GIN will run CPU-proxied: the driver refused to map the NIC's MMIO"


@dataclasses.dataclass(frozen=True)
class GinCheck:
    """The registration NCCL makes of the doorbell page, and what it means for the job."""

    outcome: str                       # mapped | refused | not run
    gpu: str
    nic: str | None
    summary: str                       # the outcome named, in a sentence
    doorbell: str = ""                 # the UAR page registered, as libmlx5 gave it
    calls: tuple[str, ...] = ()        # each call made and its result, in order
    predicted: str = ""                # the doctor's mode before the call (gin.gpu.<bdf>)
    mode: str = ""                     # the mode NCCL (or NVSHMEM) takes, with the outcome known
    library: str = "NCCL GIN"          # whose mode: NCCL GIN, or NVSHMEM IBGDA where the job sets it
    asked: str = ""                    # how the job asked for GIN explicitly; "" it did not
    exit_code: int | None = None       # what it adds to the check's exit: None, 13, 10 or 1
    fix: str = ""
