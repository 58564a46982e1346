"""What a CUresult means for the job that would start on this node, and so for a scheduler.

The policy, decided per result from what the job will meet (each meaning quoted from the
CUresult documentation that cuda-python's ``cuda.bindings.driver.CUresult`` carries, 12.9):

- **the node is broken for every CUDA process** (:class:`GpuUnusable`, exit 11, drain): a
  job started here fails its first CUDA call exactly as the check did.
  ``CUDA_ERROR_SYSTEM_NOT_READY`` (802, "the system is not yet ready to start any CUDA work
  ... all required driver daemons are actively running": the fabric manager of an NVSwitch
  system), ``CUDA_ERROR_SYSTEM_DRIVER_MISMATCH`` (803, "a mismatch between the versions of
  the display driver and the CUDA driver": a driver upgraded without a reboot),
  ``CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE`` (804, "the system was upgraded to run with
  forward compatibility but the visible hardware ... does not support this configuration"),
  ``CUDA_ERROR_DEVICE_UNAVAILABLE`` (46, "unavailable due to use of
  CU_COMPUTEMODE_EXCLUSIVE_PROCESS or CU_COMPUTEMODE_PROHIBITED": another process holds the
  GPU, or no process may use it), ``CUDA_ERROR_ECC_UNCORRECTABLE`` (214),
  ``CUDA_ERROR_NVLINK_UNCORRECTABLE`` (220) and ``CUDA_ERROR_CONTAINED`` (226, "an exception
  occurred on the device that is now contained by the GPU's error containment capability":
  a check runs no kernel, so in its process it is the hardware's).
- **the check cannot run, and that says nothing against the node** (:class:`NotTestable`,
  exit 9, warn): ``CUDA_ERROR_NO_DEVICE`` (100: no GPU to test), ``CUDA_ERROR_OUT_OF_MEMORY``
  (2: other processes hold the memory, in a training job possibly the job itself; a
  :class:`GpuOutOfMemory`), ``CUDA_ERROR_STUB_LIBRARY`` (34: the check's own environment
  loads the toolkit's stub), ``CUDA_ERROR_MPS_CONNECTION_FAILED`` (805: MPS daemons are often started
  per job, Slurm's gres/mps among them, so a prolog's view of them says nothing of the job's).
- **any other result** is a :class:`CudaError` naming the call and the result; in the A/B it
  makes the GPU arm "not testable" with that cause.

What the PCI bus says changes three start-up results. ``CUDA_ERROR_NO_DEVICE`` (100: the
driver detected no CUDA-capable device), ``CUDA_ERROR_OPERATING_SYSTEM`` (304: an operating
system call failed, e.g. opening the GPU's device files) and ``CUDA_ERROR_UNKNOWN`` (999: an
internal driver error) are "no GPU here" only where there is none. Where sysfs still lists
NVIDIA GPU functions that CUDA should see, the GPU has fallen off the bus (Xid 79) or the
driver is broken: a job started here fails the same way, so it is a :class:`GpuUnusable`
with that evidence (:func:`lost_gpus_error`). Likewise a driver that starts but lists fewer
of those GPUs than sysfs does (:func:`missing_gpus_error`): a job that counts on the node's
GPUs meets one missing. Which GPUs CUDA should see is the caller's to say (the doctor reads
sysfs: :mod:`gdrprobe.doctor.checks.gpu`); the rules here compare.

Every error :func:`result_error` makes carries the result's name as ``cuda_result`` and the
call as ``cuda_call``, so that a caller that knows more (sysfs) can apply the rules above.

A driver older than a call is no CUresult (the runtime API's cudaErrorCallRequiresNewerDriver
has no driver-API twin): the bindings raise when the driver lacks the entry point, and
:func:`gdrprobe.memory.cuda_driver.attempt` says so. Every name here is a CUresult of a
supported cuda-python (the binding suite checks it).

A result the installed cuda-python does not know (the driver is newer than the bindings)
reaches gdrprobe as the bindings' ``ValueError`` ("226 is not a valid CUresult") instead of
a result: :func:`unknown_result` turns it back into a result with a name, so the policy
above applies to it as to any other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gdrprobe.errors import CudaError, GdrprobeError, GpuOutOfMemory, GpuUnusable, NotTestable

NO_GPU_FIX = ("check that nvidia-smi lists the GPU and that CUDA_VISIBLE_DEVICES does not hide "
              "it; without a GPU only the host arm can run")
UPGRADE_DRIVER_FIX = ("upgrade the NVIDIA driver ('nvidia-smi' shows its version; DMA-BUF export "
                      "needs CUDA 11.7+, the PCIe mapping CUDA 12.8+)")
GENERIC_FIX = "check dmesg for Xid errors and 'nvidia-smi' for the GPU's state"
HARDWARE_FIX = ("check dmesg for Xid errors and 'nvidia-smi -q -d ECC,ROW_REMAPPER'; reset the "
                "GPU (nvidia-smi -r) or reboot, and have the GPU replaced if it recurs")

# Results newer drivers return that the oldest supported cuda-python (12.6.2.post1) lacks:
# names from cuda-python 12.9's cuda.bindings.driver.CUresult.
NEWER_RESULT_NAMES = {226: "CUDA_ERROR_CONTAINED", 721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
                      916: "CUDA_ERROR_KEY_ROTATION"}

# CUresult name -> (error class, cause, fix); every other result is a CudaError.
RESULT_ERRORS: dict[str, tuple[type[GdrprobeError], str, str]] = {
    "CUDA_ERROR_NO_DEVICE": (NotTestable, "not testable: no GPU: the CUDA driver sees none",
                             NO_GPU_FIX),
    "CUDA_ERROR_OUT_OF_MEMORY": (GpuOutOfMemory, "not testable: CUDA is out of memory (GPU "
                                 "memory other processes hold, or pinned host memory)",
                                 "free GPU memory (other processes: nvidia-smi) or use smaller "
                                 "sizes, and run the check again"),
    "CUDA_ERROR_STUB_LIBRARY": (NotTestable, "not testable: the libcuda.so.1 loaded is the CUDA "
                                "toolkit's stub, not the driver",
                                "take the toolkit's lib64/stubs directory out of "
                                "LD_LIBRARY_PATH so the driver's libcuda.so.1 loads"),
    "CUDA_ERROR_MPS_CONNECTION_FAILED": (NotTestable, "not testable: CUDA MPS is configured "
                                         "but its control daemon cannot be reached",
                                         "start it (nvidia-cuda-mps-control -d) or unset "
                                         "CUDA_MPS_PIPE_DIRECTORY"),
    "CUDA_ERROR_DEVICE_UNAVAILABLE": (GpuUnusable, "the GPU is unavailable to any other "
                                      "process: its compute mode is exclusive-process with "
                                      "another process on it, or prohibited",
                                      "see 'nvidia-smi -q -d COMPUTE' and the processes on the "
                                      "GPU (nvidia-smi); end the one that holds it, or set the "
                                      "compute mode to DEFAULT (nvidia-smi -c DEFAULT)"),
    "CUDA_ERROR_SYSTEM_NOT_READY": (GpuUnusable, "the CUDA system is not ready: on an NVSwitch "
                                    "system (HGX, DGX) the NVIDIA fabric manager is not "
                                    "running or has not finished",
                                    "systemctl enable --now nvidia-fabricmanager (its version "
                                    "must equal the driver's); 'nvidia-smi -q' shows the "
                                    "fabric state"),
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": (GpuUnusable, "the CUDA driver library "
                                          "(libcuda.so.1) and the nvidia kernel module "
                                          "versions differ",
                                          "reboot or reload the nvidia kernel module after a "
                                          "driver upgrade; in a container, use the host's "
                                          "driver libraries (NVIDIA container runtime)"),
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": (GpuUnusable, "the CUDA "
                                                  "forward-compatibility libraries are in use "
                                                  "and this GPU does not support them",
                                                  "take cuda-compat's directory out of "
                                                  "LD_LIBRARY_PATH (or remove the cuda-compat "
                                                  "package) so the driver's own libcuda.so.1 "
                                                  "loads; run the check in the job's image"),
    "CUDA_ERROR_ECC_UNCORRECTABLE": (GpuUnusable, "the GPU reported an uncorrectable ECC "
                                     "error", HARDWARE_FIX),
    "CUDA_ERROR_NVLINK_UNCORRECTABLE": (GpuUnusable, "the GPU reported an uncorrectable "
                                        "NVLink error", HARDWARE_FIX),
    "CUDA_ERROR_CONTAINED": (GpuUnusable, "the GPU contained a hardware error (error "
                             "containment): the GPU must be reset", HARDWARE_FIX),
}


class UnknownResult:
    """A CUresult the installed bindings have no member for: its number and, where a newer
    cuda-python names it, that name."""

    def __init__(self, value: int):
        self.value = value
        known = NEWER_RESULT_NAMES.get(value)
        self.name = (f"{known} (CUresult {value}, unknown to this cuda-python)" if known
                     else f"CUresult {value} (unknown to this cuda-python)")
        self.policy_name = known or ""

    def __int__(self) -> int:
        return self.value


# The bindings build the result from the driver's integer with CUresult(value), which
# raises ValueError("226 is not a valid CUresult") for a value the enum lacks.
_NOT_A_RESULT = re.compile(r"^(-?\d+) is not a valid CUresult")


def unknown_result(error: ValueError) -> UnknownResult | None:
    """The result behind the bindings' ValueError for an unknown CUresult; None when the
    ValueError is about something else."""
    found = _NOT_A_RESULT.match(str(error))
    return UnknownResult(int(found.group(1))) if found else None


def result_name(err) -> str:
    """The CUresult's name as a person reads it."""
    return getattr(err, "name", None) or f"CUresult {int(err)}"


def result_error(err, what: str) -> GdrprobeError:
    """The error a failed driver call's result means (the policy above), carrying the
    result's name as ``cuda_result``."""
    name = result_name(err)
    policy = getattr(err, "policy_name", name)
    error_class, cause, fix = RESULT_ERRORS.get(
        policy, (CudaError, "a CUDA driver call failed", GENERIC_FIX))
    error = error_class(f"{cause} ({what} returned {name})", fix, evidence=f"{what}: {name}")
    error.cuda_result, error.cuda_call = policy or name, what
    return error


# ---- what the PCI bus says: GPUs the driver lost ---------------------------------------

# cuInit results that, with NVIDIA GPUs on the bus that CUDA should see, mean those GPUs are
# lost to every CUDA process (meanings: the CUresult documentation, cuda.h).
LOST_GPU_RESULTS = ("CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_OPERATING_SYSTEM", "CUDA_ERROR_UNKNOWN")
LOST_GPU_FIX = ("check dmesg for Xid errors (Xid 79: the GPU has fallen off the bus) and "
                "'nvidia-smi' for the GPUs it still lists; reset the GPU (nvidia-smi -r) or "
                "reboot; where the nvidia kernel module is not loaded (lsmod), reload or "
                "reinstall the driver; have a GPU that keeps falling off replaced")


def lost_gpus_error(result: str, sysfs_gpus: Sequence[str],
                    call: str = "cuInit(0)") -> GpuUnusable | None:
    """The node fault behind the result of the driver's start-up (cuInit, or a call that
    lists the GPUs) where sysfs lists GPUs CUDA should see (bus ids), or None: no such GPU,
    or a result that is no sign of a lost GPU."""
    if result not in LOST_GPU_RESULTS or not sysfs_gpus:
        return None
    return GpuUnusable(
        f"the GPUs are lost to CUDA: sysfs lists {len(sysfs_gpus)} NVIDIA GPU(s) and "
        f"{call} returned {result} (a GPU fallen off the bus or a broken driver): every "
        "CUDA process here fails the same way", LOST_GPU_FIX,
        evidence=f"sysfs: {len(sysfs_gpus)} NVIDIA GPU(s) ({', '.join(sysfs_gpus)}); "
                 f"CUDA: {call} returned {result}")


def missing_gpus_error(cuda_gpus: Sequence[str], sysfs_gpus: Sequence[str]) -> GpuUnusable | None:
    """The node fault of a driver that lists fewer of the GPUs sysfs lists (bus ids, as
    sysfs spells them), or None when CUDA lists every one."""
    missing = [bus_id for bus_id in sysfs_gpus if bus_id not in set(cuda_gpus)]
    if not missing:
        return None
    return GpuUnusable(
        f"CUDA lists {len(cuda_gpus)} of the {len(sysfs_gpus)} NVIDIA GPUs sysfs lists: "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} lost to CUDA (fallen "
        "off the bus, or the driver failed on it); a job that uses the node's GPUs meets it",
        LOST_GPU_FIX,
        evidence=f"sysfs: {len(sysfs_gpus)} NVIDIA GPU(s) ({', '.join(sysfs_gpus)}); "
                 f"CUDA: cuDeviceGetCount() = {len(cuda_gpus)} "
                 f"({', '.join(cuda_gpus) or 'none'})")
