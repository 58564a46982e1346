"""A third GPU runtime, registered by tests alone: one file holding what a new runtime adds
(docs/ARCHITECTURE.md, "How to add a GPU runtime"): its record (what memory/<key>.py holds)
and its facts collector (what doctor/facts/<key>.py holds). Its GPUs are Intel's display
controllers (0x0380); its driver lists the GPUs named in LISTED_FILE."""

from __future__ import annotations

from typing import Any

from gdrprobe.doctor.facts.nccl_library import NCCL
from gdrprobe.errors import GpuUnusable
from gdrprobe.memory.runtime import GpuRuntime
from gdrprobe.sysroot import SysRoot

MODULE = __name__
VENDOR, DISPLAY_CLASS = 0x8086, 0x038000
LISTED_FILE = "/sys/class/third/gpus"     # the driver's list of its GPUs, one bus id a line
OPENED: list[str] = []


class ThirdGpu:
    """An open GPU of the third runtime: only its bus id is asked."""

    def __init__(self, selector: str):
        self.bus_id = selector

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        pass


def open_gpu(selector: str) -> ThirdGpu:
    OPENED.append(selector)
    return ThirdGpu(selector)


def require_library() -> None:
    pass


RUNTIME = GpuRuntime("Third", "third", VENDOR, require_library, open_gpu, (DISPLAY_CLASS >> 8,),
                     visible_devices=("ZE_AFFINITY_MASK",), facts=MODULE)

# ---- the collector -------------------------------------------------------------------------
COLLECTIVE = NCCL
FACTS_FILE = "/gdrprobe-capture/third.json"


def collect(ctx) -> dict[str, Any]:
    return {"gpus": [{"ordinal": i, "pci_bus_id": bdf}
                     for i, bdf in enumerate(listed_gpus(ctx.root, RUNTIME))]}


def listed_gpus(root: SysRoot, runtime) -> tuple[str, ...]:
    return tuple((root.read(LISTED_FILE) or "").split())


def lost_gpus(ctx) -> GpuUnusable | None:
    missing = [bdf for bdf in ctx.runtime.bus_gpus(ctx.root) if bdf not in listed_gpus(ctx.root, RUNTIME)]
    return GpuUnusable(f"the third runtime lost {', '.join(missing)}", "reload its driver",
                       evidence=LISTED_FILE) if missing else None


def memory_paths(ctx, paths):
    return paths
