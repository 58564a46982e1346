"""The doctor's side of the GPU runtimes (:mod:`gdrprobe.memory.runtime`): each runtime's
facts collector, found through the runtime's record, and the GPUs every registered runtime's
driver lists.

A collector is a module of this folder named by the record's ``facts`` (``cuda``, ``rocm``;
a full dotted name for one that lives elsewhere) and offers, as :class:`Collector` says:
``COLLECTIVE`` (its collective library, how it is found and its rules: NCCL's, RCCL's),
``FACTS_FILE`` (where a capture keeps what only a live call tells), ``collect`` (that live
call), ``listed_gpus`` (the GPUs its driver lists, for the topology), ``lost_gpus`` (the
node fault where the driver lost GPUs the PCI bus holds) and ``memory_paths`` (its
collective library's registration rules applied to the node's memory paths). The records
live below the doctor, so the doctor imports them inside functions only.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from gdrprobe.sysroot import SysRoot

if TYPE_CHECKING:    # the record (memory layer) and the context, named for the types
    from gdrprobe.doctor.facts.context import DoctorContext
    from gdrprobe.doctor.facts.nccl_library import Collective
    from gdrprobe.errors import GpuUnusable
    from gdrprobe.nccl.gdr_support import MemoryPaths

FACTS_PACKAGE = "gdrprobe.doctor.facts"


class Collector(Protocol):
    """What the doctor asks of a runtime's collector module."""

    COLLECTIVE: Collective
    FACTS_FILE: str

    def collect(self, ctx: DoctorContext) -> dict[str, Any]: ...

    def listed_gpus(self, root: SysRoot, runtime: Any) -> tuple[str, ...]: ...

    def lost_gpus(self, ctx: DoctorContext) -> GpuUnusable | None: ...

    def memory_paths(self, ctx: DoctorContext, paths: MemoryPaths) -> MemoryPaths: ...


def collector(runtime: Any) -> ModuleType:
    """The runtime's facts collector (a :class:`Collector` module)."""
    name = runtime.facts if "." in runtime.facts else f"{FACTS_PACKAGE}.{runtime.facts}"
    return importlib.import_module(name)


def every_runtime() -> list[Any]:
    from gdrprobe.memory.runtime import runtimes

    return runtimes()


def listed_gpus(root: SysRoot) -> set[str]:
    """The PCI bus ids of the GPUs any registered runtime's driver lists."""
    return {bdf for runtime in every_runtime() for bdf in collector(runtime).listed_gpus(root, runtime)}
