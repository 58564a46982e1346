"""libmlx5's data-direct calls, loaded at run time as NCCL loads them (NVIDIA/nccl 2.30.7
``src/misc/mlx5dvsymbols.cc``: ``dlvsym`` of ``mlx5dv_get_data_direct_sysfs_path`` and
``mlx5dv_reg_dmabuf_mr`` at version ``MLX5_1.25``; a library without them is no error,
only no data-direct). ctypes, not pyverbs: the doctor runs without the extension, the
distributions' pyverbs (rdma-core before 52) has neither call, and one sequence of C calls
is what NCCL's ncclIbInitDevices makes on each device:

``mlx5dv_is_supported``; ``ibv_alloc_pd``; ``ibv_reg_dmabuf_mr`` and ``mlx5dv_reg_dmabuf_mr``
with fd -1 (ncclMlx5dvDmaBufCapable reads errno after both); ``mlx5dv_get_data_direct_sysfs_path``
(rdma-core providers/mlx5/man/mlx5dv_get_data_direct_sysfs_path.3.md: 0, or an errno;
ENODEV: no data-direct device). The rules over the result: :mod:`gdrprobe.nccl.data_direct`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
from typing import Any

from gdrprobe.errors import errno_label

LIBMLX5 = "libmlx5.so.1"
LIBIBVERBS = "libibverbs.so.1"
MLX5_1_25 = "MLX5_1.25"
# providers/mlx5/mlx5dv.h enum mlx5dv_reg_dmabuf_access (rdma-core 52 on).
MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT = 1 << 0
PATH_MAX = 4096

_vp, _int, _u64, _size = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t


class Unavailable(Exception):
    """libmlx5 or libibverbs cannot be loaded: the machine has no data-direct to offer."""


@functools.cache
def _libc_dlvsym():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    dlvsym = libc.dlvsym
    dlvsym.restype, dlvsym.argtypes = _vp, (_vp, ctypes.c_char_p, ctypes.c_char_p)
    return dlvsym


def versioned(library: ctypes.CDLL, name: str, version: str, restype, argtypes):
    """``name@version`` in ``library`` as a ctypes function keeping errno, or None."""
    address = _libc_dlvsym()(library._handle, name.encode(), version.encode())
    if not address:
        return None
    prototype = ctypes.CFUNCTYPE(restype, *argtypes, use_errno=True)
    return prototype(address)


def plain(library: ctypes.CDLL, name: str, restype, argtypes):
    function = getattr(library, name, None)
    if function is not None:
        function.restype, function.argtypes = restype, argtypes
    return function


class Mlx5dv:
    """The calls NCCL makes, bound once; a symbol the library lacks is None."""

    def __init__(self, libmlx5: str = LIBMLX5, libibverbs: str = LIBIBVERBS):
        try:
            self.verbs = ctypes.CDLL(libibverbs, use_errno=True)
            self.mlx5 = ctypes.CDLL(libmlx5, use_errno=True)
        except OSError as error:
            raise Unavailable(f"cannot load {libmlx5} ({error})") from error
        v = self.verbs
        self.get_device_list = plain(v, "ibv_get_device_list", ctypes.POINTER(_vp), (ctypes.POINTER(_int),))
        self.free_device_list = plain(v, "ibv_free_device_list", None, (ctypes.POINTER(_vp),))
        self.get_device_name = plain(v, "ibv_get_device_name", ctypes.c_char_p, (_vp,))
        self.open_device = plain(v, "ibv_open_device", _vp, (_vp,))
        self.close_device = plain(v, "ibv_close_device", _int, (_vp,))
        self.alloc_pd = plain(v, "ibv_alloc_pd", _vp, (_vp,))
        self.dealloc_pd = plain(v, "ibv_dealloc_pd", _int, (_vp,))
        self.reg_dmabuf_mr = plain(v, "ibv_reg_dmabuf_mr", _vp, (_vp, _u64, _size, _u64, _int, _int))
        self.is_supported = plain(self.mlx5, "mlx5dv_is_supported", ctypes.c_bool, (_vp,))
        self.mlx5_reg_dmabuf_mr = versioned(self.mlx5, "mlx5dv_reg_dmabuf_mr", MLX5_1_25, _vp,
                                            (_vp, _u64, _size, _u64, _int, _int, _int))
        self.get_data_direct_sysfs_path = versioned(self.mlx5, "mlx5dv_get_data_direct_sysfs_path", MLX5_1_25,
                                                    _int, (_vp, ctypes.c_char_p, _size))

    def refusal(self, register, *arguments) -> int | None:
        """errno after a dummy registration with fd -1, as NCCL reads it; an absent symbol
        reads as EOPNOTSUPP (mlx5dvwrap.cc wrap_direct_mlx5dv_reg_dmabuf_mr)."""
        if register is None:
            return errno.EOPNOTSUPP
        ctypes.set_errno(0)
        register(*arguments)
        return ctypes.get_errno() or None

    def probe_context(self, device, context) -> dict[str, Any]:
        """NCCL's data-direct sequence on one open device."""
        if self.is_supported is None or not self.is_supported(device):
            return {"mlx5": False}
        pd = self.alloc_pd(context)
        if not pd:
            return {"error": f"ibv_alloc_pd failed ({errno.errorcode.get(ctypes.get_errno(), '?')})"}
        try:
            plain_refusal = self.refusal(self.reg_dmabuf_mr, pd, 0, 0, 0, -1, 0)
            mlx5_refusal = self.refusal(self.mlx5_reg_dmabuf_mr, pd, 0, 0, 0, -1, 0, 0)
        finally:
            self.dealloc_pd(pd)
        # ncclMlx5dvDmaBufCapable reads errno once, after both calls: the second's where it set one.
        last = mlx5_refusal if mlx5_refusal is not None else plain_refusal
        result: dict[str, Any] = {"mlx5": True, "dmabuf_errno": last}
        if self.get_data_direct_sysfs_path is None:
            return {**result, "path": None, "errno": errno.EOPNOTSUPP}
        buffer = ctypes.create_string_buffer(PATH_MAX)
        code = self.get_data_direct_sysfs_path(context, buffer, PATH_MAX)
        if code:
            return {**result, "path": None, "errno": code}
        return {**result, "path": buffer.value.decode(errors="replace"), "errno": None}

    def probe(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """The sequence on each named RDMA device; a device libibverbs does not list or cannot
        open gets an error."""
        count = _int(0)
        listed = self.get_device_list(ctypes.byref(count))
        if not listed:
            return {name: {"error": "ibv_get_device_list failed"} for name in names}
        try:
            devices = {self.get_device_name(listed[i]).decode(): listed[i] for i in range(count.value)}
            return {name: self.probe_device(devices.get(name), name) for name in names}
        finally:
            self.free_device_list(listed)

    def probe_device(self, device, name: str) -> dict[str, Any]:
        if device is None:
            return {"error": f"libibverbs does not list {name}"}
        context = self.open_device(device)
        if not context:
            return {"error": f"ibv_open_device({name}) failed"}
        try:
            return self.probe_context(device, context)
        finally:
            self.close_device(context)


@functools.cache
def loaded(libmlx5: str = LIBMLX5) -> Mlx5dv:
    """The calls bound once per process and library (the probe, then each registration);
    Unavailable is not kept, so a library installed later is found."""
    return Mlx5dv(libmlx5)


def probe_data_direct(names: list[str], libmlx5: str = LIBMLX5) -> dict[str, Any]:
    """``{"devices": {name: result}}``, or ``{"error": why}`` where libmlx5 cannot be loaded."""
    try:
        library = loaded(libmlx5)
    except Unavailable as error:
        return {"error": str(error)}
    return {"devices": library.probe(names)}


def data_direct_path(device: str, libmlx5: str = LIBMLX5) -> str | None:
    """The device's data-direct sysfs path (/sys prefixed) where libmlx5 gives one; None:
    no libmlx5, no MLX5_1.25, not mlx5, or not data-direct."""
    found = probe_data_direct([device], libmlx5).get("devices", {}).get(device, {})
    return "/sys" + found["path"] if found.get("path") else None


# ---- registration through the data-direct rung ------------------------------------------


class IbvMr(ctypes.Structure):
    """The head of struct ibv_mr (rdma-core libibverbs/verbs.h), as far as the keys."""

    _fields_ = [("context", _vp), ("pd", _vp), ("addr", _vp), ("length", _size),
                ("handle", ctypes.c_uint32), ("lkey", ctypes.c_uint32), ("rkey", ctypes.c_uint32)]


ROUTE_PYVERBS = "pyverbs' Mlx5DmaBufMR"
ROUTE_LIBMLX5 = "libmlx5's mlx5dv_reg_dmabuf_mr through ctypes (this pyverbs has no Mlx5DmaBufMR: rdma-core < 55)"


class DataDirectRegion:
    """A memory region libmlx5 registered for us: its keys, and close() deregisters it."""

    def __init__(self, library: Mlx5dv, pointer: int, pd):
        self._library, self._pointer, self.pd = library, pointer, pd
        head = IbvMr.from_address(pointer)
        self.lkey, self.rkey = head.lkey, head.rkey

    def close(self) -> None:
        pointer, self._pointer = self._pointer, None
        if pointer:
            plain(self._library.verbs, "ibv_dereg_mr", _int, (_vp,))(pointer)


def register_data_direct(pd, length: int, access: int, fd: int, offset: int):
    """mlx5dv_reg_dmabuf_mr(pd, offset, length, iova=offset, fd, access,
    MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT), as NCCL registers on a ``<dev>_dma`` device:
    pyverbs' Mlx5DmaBufMR where it has one (rdma-core 55 on), else libmlx5 directly on the
    PD pyverbs owns. A refusal is pyverbs' PyverbsRDMAError with the errno and the route."""
    from gdrprobe.rdma import verbs

    pv = verbs.pyverbs()
    try:
        from pyverbs.providers.mlx5.mlx5dv_dmabuf import Mlx5DmaBufMR
    except ImportError:
        Mlx5DmaBufMR = None
    if Mlx5DmaBufMR is not None:
        try:
            return Mlx5DmaBufMR(pd, offset, length, iova=offset, fd=fd, access=access,
                                mlx5_access=MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT), ROUTE_PYVERBS
        except pv.PyverbsRDMAError as error:
            error.route = ROUTE_PYVERBS
            raise
    return _register_through_libmlx5(pv, pd, length, access, fd, offset), ROUTE_LIBMLX5


def _register_through_libmlx5(pv, pd, length: int, access: int, fd: int, offset: int) -> DataDirectRegion:
    from gdrprobe.rdma.handles import pd_pointer

    def refused(text: str, code: int):
        error = pv.PyverbsRDMAError(text, code)
        error.route = ROUTE_LIBMLX5
        return error

    try:
        library = loaded()
    except Unavailable as error:
        raise refused(str(error), errno.EOPNOTSUPP) from error
    if library.mlx5_reg_dmabuf_mr is None:
        raise refused(f"{LIBMLX5} has no mlx5dv_reg_dmabuf_mr@{MLX5_1_25}", errno.EOPNOTSUPP)
    ctypes.set_errno(0)
    pointer = library.mlx5_reg_dmabuf_mr(pd_pointer(pd), offset, length, offset, fd, access,
                                         MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)
    if not pointer:
        code = ctypes.get_errno() or errno.EINVAL
        raise refused(f"Failed to register a data-direct dma-buf MR. length: {length}, access flags: {access}", code)
    return DataDirectRegion(library, pointer, pd)


# ---- a doorbell page, as NCCL's GDAKI path allocates it ------------------------------------

MLX5_1_7 = "MLX5_1.7"
# providers/mlx5/mlx5_api.h: MLX5DV_UAR_ALLOC_TYPE_NC (MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC) and
# MLX5DV_UAR_ALLOC_TYPE_NC_DEDICATED (1U << 31).
UAR_ALLOC_TYPE_NC = 0x1
UAR_ALLOC_TYPE_NC_DEDICATED = 1 << 31
# NCCL's DOCA GPUNetIO asks a non-cached dedicated UAR first and a non-cached one where that is
# refused (src/transport/net_ib/gdaki/doca-gpunetio/src/doca_gpunetio_high_level.cpp create_uar;
# rdma-core before the dedicated flag answers EOPNOTSUPP).
UAR_ORDER = ((UAR_ALLOC_TYPE_NC_DEDICATED, "non-cached dedicated"), (UAR_ALLOC_TYPE_NC, "non-cached"))


class DevxUar(ctypes.Structure):
    """struct mlx5dv_devx_uar (providers/mlx5/mlx5dv.h)."""

    _fields_ = [("reg_addr", _vp), ("base_addr", _vp), ("page_id", ctypes.c_uint32),
                ("mmap_off", ctypes.c_long), ("comp_mask", ctypes.c_uint64)]


class Doorbell:
    """A UAR libmlx5 allocated on an open device: ``address`` is its doorbell register (the
    page's ``reg_addr``, the address DOCA hands cudaHostRegister); close() frees it."""

    def __init__(self, free, uar, kind: str, refused: tuple[str, ...]):
        self._free, self._uar = free, uar
        self.address = int(uar.contents.reg_addr or 0)
        self.page_id = int(uar.contents.page_id)
        self.kind = kind                 # "non-cached dedicated" or "non-cached"
        self.refused = refused           # the allocations refused before it, with errno

    def close(self) -> None:
        uar, self._uar = self._uar, None
        if uar:
            self._free(uar)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class NoDoorbell(Exception):
    """libmlx5 gave no UAR: why, in words (the device, the calls and their errno)."""


def uar_calls(library: Mlx5dv):
    """(mlx5dv_devx_alloc_uar, mlx5dv_devx_free_uar) at MLX5_1.7, or None where the library lacks them."""
    alloc = versioned(library.mlx5, "mlx5dv_devx_alloc_uar", MLX5_1_7, ctypes.POINTER(DevxUar),
                      (_vp, ctypes.c_uint32))
    free = versioned(library.mlx5, "mlx5dv_devx_free_uar", MLX5_1_7, None, (ctypes.POINTER(DevxUar),))
    return (alloc, free) if alloc is not None and free is not None else None


def alloc_doorbell(library: Mlx5dv, context) -> Doorbell:
    """A doorbell page on an open device (``context``: its struct ibv_context *), in NCCL's
    order of UAR types; raises NoDoorbell where libmlx5 gives none."""
    calls = uar_calls(library)
    if calls is None:
        raise NoDoorbell(f"{LIBMLX5} has no mlx5dv_devx_alloc_uar@{MLX5_1_7}")
    alloc, free = calls
    refused: list[str] = []
    for flags, kind in UAR_ORDER:
        ctypes.set_errno(0)
        uar = alloc(context, flags)
        if uar:
            return Doorbell(free, uar, kind, tuple(refused))
        code = ctypes.get_errno() or errno.EINVAL
        refused.append(f"mlx5dv_devx_alloc_uar({kind}) failed: {errno_label(code)}")
    raise NoDoorbell("; ".join(refused))


@contextlib.contextmanager
def opened(library: Mlx5dv, name: str):
    """The ibv_context of RDMA device ``name``, closed on leaving; NoDoorbell where libibverbs
    does not list it, it cannot be opened or libmlx5 does not drive it (mlx5dv_is_supported)."""
    count = _int(0)
    listed = library.get_device_list(ctypes.byref(count))
    if not listed:
        raise NoDoorbell("ibv_get_device_list failed")
    try:
        device = next((listed[i] for i in range(count.value)
                       if library.get_device_name(listed[i]).decode() == name), None)
        if device is None:
            raise NoDoorbell(f"libibverbs does not list {name}")
        if library.is_supported is None or not library.is_supported(device):
            raise NoDoorbell(f"{name} is not an mlx5 device (mlx5dv_is_supported)")
        context = library.open_device(device)
        if not context:
            raise NoDoorbell(f"ibv_open_device({name}) failed")
    finally:
        library.free_device_list(listed)
    try:
        yield context
    finally:
        library.close_device(context)
