"""The doctor's facts are read once per run and shared by every check that needs them
(:class:`gdrprobe.doctor.facts.context.DoctorContext`): the kernel release, the NVIDIA
driver's version line, the container markers and the RDMA ports feed several checks and
NCCL's rules."""

from __future__ import annotations

import collections

from gdrprobe.doctor.runner import run_doctor
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines


class CountingRoot(SysRoot):
    """A root that counts the reads of each file."""

    def __init__(self, root: str):
        super().__init__(root)
        self.reads: collections.Counter = collections.Counter()

    def read_bytes(self, path: str, limit: int = 4096) -> bytes | None:
        self.reads[path] += 1
        return super().read_bytes(path, limit)


def test_shared_facts_are_read_once_per_doctor_run(tmp_path):
    tree = nccl_machines.dmabuf_only(tmp_path)
    tree.write("/proc/1/cgroup", "0::/\n")
    root = CountingRoot(str(tmp_path))
    run_doctor(str(tmp_path), environ={}, sysroot=root)
    shared = ("/proc/sys/kernel/osrelease", "/proc/driver/nvidia/version", "/proc/1/cgroup",
              "/sys/class/infiniband/mlx5_0/ports/1/state", "/sys/class/infiniband/mlx5_0/ports/1/link_layer")
    assert {path: root.reads[path] for path in shared} == dict.fromkeys(shared, 1)
