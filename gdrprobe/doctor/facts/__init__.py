"""The doctor's facts: what the machine says, read once per run and shared by every check.

Each collector reads one kind of fact under a :class:`gdrprobe.sysroot.SysRoot` (sysfs,
procfs, the CUDA driver, NVML, NCCL's NIC probe) and says where it came from;
:class:`context.DoctorContext` gathers them lazily, and ``capture`` replays the same reads.
No collector judges: the checks (:mod:`gdrprobe.doctor.checks`) and NCCL's rules
(:mod:`gdrprobe.nccl`) do.
"""

# Where a capture keeps, inside the captured tree, what only a live call tells.
CAPTURE_DIR = "/gdrprobe-capture"
