"""``check --gin``: can this GPU ring this NIC's doorbell? The call NCCL's GIN makes, made here.

NCCL's GDAKI backend (through DOCA GPUNetIO, NVIDIA/nccl v2.30.7
``src/transport/net_ib/gdaki/doca-gpunetio/src``) allocates a UAR on the NIC with
``mlx5dv_devx_alloc_uar`` (non-cached dedicated, else non-cached: doca_gpunetio_high_level.cpp
create_uar) and, before any QP exists, asks ``cudaHostRegister(reg_addr, 8, Portable | Mapped |
IoMemory)`` (doca_gpunetio.cpp doca_gpu_verbs_can_gpu_register_uar), then
``cudaHostGetDevicePointer`` (doca_gpu_verbs_export_uar). The step does the same on the NIC
NCCL uses for the GPU (:mod:`gdrprobe.memory.doorbell`: libmlx5, and cuMemHostRegister with
PORTABLE | DEVICEMAP | IOMEMORY, the driver call under cudaHostRegister), and unregisters and
frees it all again, after an error or a signal too. The doctor's prediction (:mod:`gdrprobe.nccl.gin`)
is then settled by the answer, and the answer joins the check's exit code:

- the GPU maps the doorbell: nothing added;
- refused, and the job did not ask for GIN explicitly: exit 13 (warn): the job runs, and GIN,
  where it is used, runs CPU-proxied ("Enabling CPU proxy mode");
- the job asked for GIN explicitly (NCCL_GIN_ENABLE=1, NCCL_GIN_TYPE set, or
  NVSHMEM_IB_ENABLE_IBGDA=1) and this node cannot give it GPU-initiated (the driver refused, or
  the doctor's rules keep GIN off for a reason of the node): exit 1 (drain), the fix named; for a
  reason that is the job's own setting (NCCL_CUMEM_ENABLE=0, NCCL_GIN_ENABLE=0 ...): exit 10.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.errors import ExitCode
from gdrprobe.nccl.gin import (BLAME_NODE, BLAME_RELEASE, BLAME_SETTING, CPU_PROXY, EFA_GDA, GDAKI,
                               GPU_INITIATED, NO_GIN, REGISTRY_FIX, GinMode, asked_for_gin, forces_gpu_handler)
from gdrprobe.nccl.ibgda import NVSHMEM
from gdrprobe.memory.doorbell import Registration, register_doorbell
from gdrprobe.report.gin import CAN_MAP, CPU_PROXIED, MAPPED, NOT_RUN, REFUSED, GinCheck

def settled(mode: GinMode, outcome: str, environ: Mapping[str, str]) -> GinMode:
    """The doctor's mode with the registration's answer known, where the registration decides it
    (GDAKI's and NVSHMEM's doorbell handlers that try the GPU first, or insist on it)."""
    if outcome not in (MAPPED, REFUSED) or not mode.registration_decides:
        return mode
    if outcome == MAPPED:
        return dataclasses.replace(mode, mode=GPU_INITIATED, blame="", fix="",
                                   backend=GDAKI if mode.backend == GDAKI else "gpu",
                                   reason=f"{CAN_MAP}: the registration succeeded")
    if forces_gpu_handler(mode.backend, environ):
        return dataclasses.replace(mode, mode=NO_GIN, blame=BLAME_NODE, fix=REGISTRY_FIX,
                                   reason="the driver refused to map the NIC's MMIO, and the job makes the GPU "
                                          "ring the doorbell: GIN does not start")
    return dataclasses.replace(mode, mode=CPU_PROXY, blame=BLAME_NODE, fix=REGISTRY_FIX,
                               reason="DOCA GPUNetIO logs \"Enabling CPU proxy mode\" and a CPU thread rings "
                                      "the doorbell for the GPU")


def exit_of(mode: GinMode, outcome: str) -> int | None:
    """What the answer adds to the check's exit code (module docstring)."""
    if mode.mode == GPU_INITIATED:
        return None
    if mode.asked:
        return int(ExitCode.NCCL_SETTING if mode.blame in (BLAME_SETTING, BLAME_RELEASE)
                   else ExitCode.VERDICT_NOT_OK)
    return int(ExitCode.PERFORMANCE_WARNING) if outcome == REFUSED else None


def unknown_mode(gpu: str, nic: str | None, environ: Mapping[str, str]) -> GinMode:
    """The doctor had no decision for the GPU (a software NIC, a GPU it could not place): GDAKI's
    default, auto, which the registration settles."""
    return GinMode(gpu=gpu, nic=nic, mode=GPU_INITIATED, backend=GDAKI, registration_decides=True,
                   asked=asked_for_gin(environ), reason="no NCCL decision for this GPU: GDAKI's auto doorbell "
                   "handler assumed")


def gin_check(gpu: str, nic: str | None, environ: Mapping[str, str], nccl: GinMode | None = None,
              nvshmem: GinMode | None = None, libmlx5: str | None = None, opener=None) -> GinCheck:
    """The step: the registration on ``nic`` for ``gpu``, and what it means for NCCL's GIN (and
    NVSHMEM's IBGDA where the job sets its variables): the worse of the two decides."""
    nccl = nccl or unknown_mode(gpu, nic, environ)
    if nic is None:
        registration = Registration(NOT_RUN, why="no RDMA device for this GPU")
    elif nccl.backend == EFA_GDA:
        registration = Registration(NOT_RUN, why="EFA's doorbell is mapped by the aws-ofi-nccl plugin through "
                                                 "libfabric's EFA-GDA ops, not through libmlx5: only the doctor's "
                                                 "prediction stands")
    else:
        registration = register_doorbell(gpu, nic, libmlx5, opener)
    answers = [(name, settled(mode, registration.outcome, environ)) for name, mode in
               (("NCCL GIN", nccl), (NVSHMEM, nvshmem)) if mode is not None]
    library, final = max(answers, key=lambda pair: _severity(exit_of(pair[1], registration.outcome)))
    predicted = nvshmem if library == NVSHMEM else nccl
    code = exit_of(final, registration.outcome)
    return GinCheck(outcome=registration.outcome, gpu=gpu, nic=nic,
                    summary=_summary(registration, final, library),
                    doorbell=registration.doorbell, calls=registration.calls,
                    predicted=f"{predicted.mode}: {predicted.reason}",
                    mode=f"{final.mode}" + (f" ({final.backend})" if final.backend else ""), library=library,
                    asked=final.asked, exit_code=code, fix=final.fix if code is not None else "")


def _severity(code: int | None) -> int:
    return {None: 0, int(ExitCode.PERFORMANCE_WARNING): 1, int(ExitCode.NCCL_SETTING): 2,
            int(ExitCode.VERDICT_NOT_OK): 3}[code]


def _summary(registration: Registration, final: GinMode, library: str) -> str:
    if registration.outcome == MAPPED:
        head = f"{CAN_MAP} ({registration.doorbell})"
    elif registration.outcome == REFUSED:
        head = f"{CPU_PROXIED} ({registration.calls[-1] if registration.calls else 'refused'})"
        if final.mode == NO_GIN:
            head = head.replace("GIN will run CPU-proxied", "GIN will not start")
    else:
        head = f"the doorbell registration did not run: {registration.why}"
    return f"{head}; {library}: {final.mode}" + (f" ({final.backend})" if final.backend else "") + \
        f": {final.reason}" + (f"; the job asked for GIN ({final.asked})" if final.asked else "")
