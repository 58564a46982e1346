"""A capture's JSON files checked by shape before any check reads them.

``gdrprobe capture`` writes what only a live call can tell (the environment, the CUDA driver's
and NVML's facts, NCCL's NIC probe, what finding libnccl took, an AMD node's HSA facts) into
``gdrprobe-capture/*.json``; ``--root`` replays them. A file cut short, edited or crafted
(a list where an object belongs, a number where a string does, a NUL in a variable, arrays
200,000 deep) would otherwise reach the checks as a crash, or worse as a clean bill: an
``environ.json`` cut short replayed as an empty environment, and a FAIL as ``[ OK ]
nccl.env``. So each file is read within bounds (:data:`MAX_CAPTURE_JSON_BYTES`,
:data:`gdrprobe.files.MAX_JSON_DEPTH`) and matched against the shape its writer gives it
(:data:`SHAPES`); anything else is a :class:`DamagedCapture` naming the file and what is
wrong, a usage error (exit 2) before any check runs. A file a capture may lack (older
captures have no ``nics.json``; only an AMD node has ``rocm.json``) may be absent.

A shape is a Python type (``int`` never takes a bool), a tuple of alternatives, ``[shape]``
for a list, :class:`Map` for an object of any names, :class:`Record` for an object whose
named fields have shapes (``required`` ones must be there; others may be, and further
names are let be: a newer capture may hold more).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gdrprobe.errors import UsageError, quoted
from gdrprobe.files import parse_json

MAX_CAPTURE_JSON_BYTES = 16 << 20
DAMAGED_FIX = ("capture the machine again ('gdrprobe capture DEST') and replay that, or put "
               "back the file as the capture wrote it")


class DamagedCapture(UsageError):
    """A capture file that is not what ``gdrprobe capture`` writes: exit 2, the file named."""


@dataclasses.dataclass(frozen=True)
class Map:
    """An object whose names are any strings and whose values all have one shape."""

    values: Any


@dataclasses.dataclass(frozen=True)
class Record:
    """An object with named fields: those in ``required`` must be there."""

    fields: dict
    required: tuple[str, ...] = ()


NUMBER_OR_NONE = (int, None)
ENVIRON = Map(str)                     # and :func:`check_environ` on the names and values
CUDA_GPU = Record({"pci_bus_id": str, "ordinal": int, "name": str, "total_memory_bytes": int,
                   "compute_capability_major": NUMBER_OR_NONE,
                   "compute_capability_minor": NUMBER_OR_NONE,
                   "gpu_direct_rdma_supported": NUMBER_OR_NONE,
                   "dma_buf_supported": NUMBER_OR_NONE,
                   "gpu_direct_rdma_flush_writes_options": NUMBER_OR_NONE,
                   "gpu_direct_rdma_writes_ordering": NUMBER_OR_NONE,
                   "gpu_direct_rdma_with_cuda_vmm_supported": NUMBER_OR_NONE}, ("pci_bus_id",))
CUDA = (None, Record({"error": str, "result": str, "call": str, "driver_version": NUMBER_OR_NONE,
                      "gpus": [CUDA_GPU]}))
# doctor/facts/nvml.py: NCCL's facts from the driver's library (a GPU sysfs does not show has
# no bus id), nvidia-ml-py's extras where it is installed; earlier captures hold
# nvlink_remote_bus_ids instead of nvlinks.
NVLINK = Record({"link": int, "remote_type": NUMBER_OR_NONE, "remote_bus_id": (str, None)})
NVML_GPU = Record({"pci_bus_id": (str, None), "compute_capability": ([int], None),
                   "bar1_total_bytes": int, "bar1_used_bytes": int, "persistence_mode": bool,
                   "c2c_link_count": int, "c2c_bw_mbps": int, "nvlinks": [NVLINK],
                   "nvlink_remote_bus_ids": [str]}, ("pci_bus_id",))
NVML = (None, Record({"error": str}, ("error",)),
        Record({"library": str, "device_count": int, "driver_version": str, "gpus": [NVML_GPU],
                "unread": Map(str), "note": str, "extras_error": str,
                "common_ancestor": Map(Map(str))}, ("gpus",)))
NIC_PROBE = Record({"errno": NUMBER_OR_NONE, "error": str})
DATA_DIRECT = Record({"error": str, "devices": Map((None, Record({
    "mlx5": bool, "dmabuf_errno": NUMBER_OR_NONE, "path": (str, None), "errno": NUMBER_OR_NONE,
    "error": str})))})
NICS = (None, Record({"error": str, "dmabuf_probe": Map(NIC_PROBE), "data_direct": DATA_DIRECT}))
DYNAMIC = Record({"needed": [str], "soname": (str, None), "rpath": (str, None),
                  "runpath": (str, None), "nodeflib": bool})
NCCL = (None, Record({"nccl": (str, None), "site_packages": [str], "executable": (str, None),
                      "versions_in_bytes": Map((str, None)), "elf_dynamic": Map(DYNAMIC)}))
ROCM = (None, Record({"kallsyms_symbol": (bool, None), "hsa": Record({
    "error": str, "dmabuf_supported": bool, "export_symbol": bool})}))
# GIN's live facts on an EFA node (doctor/facts/gin.py collect_gin_facts).
GIN = (None, Record({"ofi_plugin": Record({"path": (str, None), "version": (str, None)}),
                     "libfabric": Record({"api": [int], "path": str, "error": str})}))

# Each file's shape, by its name in the capture; a runtime's collector this module does not
# know writes an object or null.
SHAPES = {"gdrprobe-capture/environ.json": ENVIRON, "gdrprobe-capture/cuda.json": CUDA,
          "gdrprobe-capture/nvml.json": NVML, "gdrprobe-capture/nics.json": NICS,
          "gdrprobe-capture/nccl.json": NCCL, "gdrprobe-capture/rocm.json": ROCM,
          "gdrprobe-capture/gin.json": GIN}
ANY_OBJECT = (None, Record({}))


def shape_of(name: str):
    return SHAPES.get(name, ANY_OBJECT)


TYPE_NAMES = {str: "a string", int: "a whole number", bool: "true or false", None: "null",
              float: "a number"}


def check_shape(value: Any, shape: Any, where: str = "") -> None:
    """ValueError naming where (``gpus[2].pci_bus_id``) a value differs from its shape."""
    problem = _mismatch(value, shape, where)
    if problem:
        raise ValueError(problem)


def _mismatch(value: Any, shape: Any, where: str) -> str:
    if isinstance(shape, tuple):
        problems = [_mismatch(value, alternative, where) for alternative in shape]
        if all(problems):
            # Said from the alternative of the value's own kind (an object's fields), if any.
            said = [problem for alternative, problem in zip(shape, problems)
                    if _same_kind(value, alternative)]
            return " (or) ".join(said) or \
                f"{where or 'the document'} is {_kind(value)}, not {_expected(shape)}"
        return ""
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where or 'the document'} is {_kind(value)}, not a list"
        return next((problem for index, item in enumerate(value)
                     if (problem := _mismatch(item, shape[0], f"{where}[{index}]"))), "")
    if isinstance(shape, (Map, Record)):
        if not isinstance(value, dict):
            return f"{where or 'the document'} is {_kind(value)}, not an object"
        return _object_mismatch(value, shape, where)
    if _is(value, shape):
        return ""
    return f"{where or 'the document'} is {_kind(value)}, not {TYPE_NAMES[shape]}"


def _object_mismatch(value: dict, shape: Map | Record, where: str) -> str:
    prefix = f"{where}." if where else ""
    if isinstance(shape, Map):
        return next((problem for name, item in value.items()
                     if (problem := _mismatch(item, shape.values, f"{prefix}{quoted(name)}"))), "")
    missing = [name for name in shape.required if name not in value]
    if missing:
        return f"{where or 'the document'} lacks {missing[0]!r}"
    return next((problem for name, field in shape.fields.items() if name in value
                 and (problem := _mismatch(value[name], field, f"{prefix}{name}"))), "")


def _same_kind(value: Any, shape: Any) -> bool:
    return (isinstance(shape, (Map, Record)) and isinstance(value, dict)
            or isinstance(shape, list) and isinstance(value, list))


def _is(value: Any, shape: Any) -> bool:
    if shape is None:
        return value is None
    if shape is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, shape)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return next((name for kind, name in TYPE_NAMES.items() if _is(value, kind)), "a number")


def _expected(shape: tuple) -> str:
    names = [TYPE_NAMES[item] if item is None or isinstance(item, type) else
             "a list" if isinstance(item, list) else "an object" for item in shape]
    return " or ".join(dict.fromkeys(names))


def check_environ(environ: dict) -> None:
    """The process environment as execve takes it: a name is not empty and holds neither
    '=' nor NUL, a value holds no NUL."""
    for name, value in environ.items():
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"{quoted(name)} is not an environment variable's name")
        if "\0" in value:
            raise ValueError(f"{name} holds a NUL, which no environment variable can")


def load_captured(name: str, data: bytes, shape: Any) -> Any:
    """A capture file's JSON once it has the shape its writer gives it; DamagedCapture
    naming the file (``name``) and what is wrong with it otherwise."""
    try:
        if len(data) > MAX_CAPTURE_JSON_BYTES:
            raise ValueError(f"it is larger than {MAX_CAPTURE_JSON_BYTES} bytes")
        value = parse_json(data.decode("utf-8"))
        check_shape(value, shape)
        if shape is ENVIRON:
            check_environ(value)
    except UnicodeDecodeError as error:
        raise damaged(name, f"it is not UTF-8 ({error.reason} at byte {error.start})") from None
    except ValueError as error:      # json.JSONDecodeError (cut short: "Expecting ..."), TooLarge
        raise damaged(name, str(error)) from None
    return value


def damaged(name: str, why: str) -> DamagedCapture:
    return DamagedCapture(f"the capture is damaged: {name}: {why}", DAMAGED_FIX)
