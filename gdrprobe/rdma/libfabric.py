"""libfabric's own version, asked as the aws-ofi-nccl plugin asks it: ``fi_version()``
(rdma/fabric.h: ``FI_VERSION(major, minor)``, major in the upper 16 bits), which its GIN
GDAKI gate compares with ``FI_VERSION(2, 5)`` (include/rdma/gin/nccl_ofi_gin_gdaki.h
nccl_ofi_gin_gdaki_capable). ctypes: the call has no side effect, and the doctor needs no
libfabric binding for one integer."""

from __future__ import annotations

import ctypes

# The soname first (the loader's search, as the plugin links it), then where the EFA installer
# puts it (/opt/amazon/efa), which the job's LD_LIBRARY_PATH names on AWS images.
LIBRARIES = ("libfabric.so.1", "/opt/amazon/efa/lib/libfabric.so.1", "/opt/amazon/efa/lib64/libfabric.so.1")


def fi_version(libraries: tuple[str, ...] = LIBRARIES) -> dict:
    """``{"api": [major, minor], "path": library}``, or ``{"error": why}`` where no libfabric loads."""
    errors = []
    for name in libraries:
        try:
            library = ctypes.CDLL(name)
        except OSError as error:
            errors.append(str(error))
            continue
        call = getattr(library, "fi_version", None)
        if call is None:
            errors.append(f"{name} has no fi_version")
            continue
        call.restype, call.argtypes = ctypes.c_uint32, ()
        version = int(call())
        return {"api": [version >> 16, version & 0xFFFF], "path": name}
    return {"error": "; ".join(errors) or "no libfabric"}
