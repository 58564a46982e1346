"""mlx5 data-direct devices as NCCL's IB transport opens them, by NVIDIA/nccl release (the
first tag with each rule; ``src/transport/net_ib.cc`` until 2.28.x, ``net_ib/init.cc`` from
2.29.2, ncclIbInitDevices; the 2.31 development line reads the same):

- An RDMA device is data-direct to NCCL when libmlx5 drives it (``mlx5dv_is_supported``),
  ``mlx5dv_reg_dmabuf_mr`` and ``ibv_reg_dmabuf_mr`` with fd -1 do not fail with EOPNOTSUPP
  or EPROTONOSUPPORT (ncclMlx5dvDmaBufCapable; a libmlx5 without the ``MLX5_1.25`` symbols
  counts as EOPNOTSUPP: ``src/misc/mlx5dvwrap.cc`` wrap_direct_mlx5dv_reg_dmabuf_mr), and
  ``mlx5dv_get_data_direct_sysfs_path`` (``MLX5_1.25``) returns a path. libmlx5 gives it
  without the ``/sys`` prefix (rdma-core providers/mlx5/man/mlx5dv_get_data_direct_sysfs_path.3.md).
- Such a device has two faces: itself (ORDINARY), placed at its own PCI function, and
  ``<dev>_dma`` (DATA_DIRECT), placed at the data-direct path, registering GPU memory only
  with ``mlx5dv_reg_dmabuf_mr(..., MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)``: no fallback
  (``net_ib.cc`` / ``net_ib/reg.cc`` ncclIbRegMrDmaBufInternal, NCCLCHECK on the one call),
  and flushed on every receive (:mod:`gdrprobe.nccl.flush`).
- NCCL_IB_DATA_DIRECT (default 1) chooses which faces exist:
  2.27.3-2.27.5: any non-zero value both, 0 the device alone;
  2.27.6-2.27.7: 1 ``<dev>_dma`` alone, 2 both, any other value the device alone
  (``if (ncclParamIbDataDirect() == 1)`` / ``== 2``);
  2.28.3 on: 0 or below the device alone (NCCL does not even ask), 2 both, any other
  positive value ``<dev>_dma`` alone.
- A lookup that fails: before 2.28.3 the device is no data-direct one. From 2.28.3 ENODEV
  means the same, any other result (ncclSystemError) makes ncclIbInitDevices ``return res``
  ("NET/IB: Error in mlx5dv_get_data_direct_sysfs_path"): NCCL's IB transport does not
  start, and NCCL moves the job to its next network (``src/plugin/net.cc`` ncclNetInit: the
  socket transport, or none where NCCL_NET names IB). NCCL asks once per device, at the
  first port it keeps: an ACTIVE InfiniBand or Ethernet port NCCL_IB_HCA selects, and only
  while NCCL_IB_DATA_DIRECT is positive (NVIDIA/nccl issue 1866).
- Before 2.27.3 NCCL knows nothing of data-direct: the variable is ignored.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Mapping
from typing import Any

from gdrprobe.errors import errno_label
from gdrprobe.nccl import params
from gdrprobe.nccl.env import parse_hca_filter
from gdrprobe.nccl.topo import Port, nccl_ports
from gdrprobe.nccl.versions import (DATA_DIRECT_ALONE_SINCE, DATA_DIRECT_LOOKUP_FATAL_SINCE, DATA_DIRECT_SINCE,
                                    NcclRules)

VARIABLE = params.IB_DATA_DIRECT.name
DEFAULT = params.IB_DATA_DIRECT.default()
BOTH = 2                     # NCCL_IB_DATA_DIRECT=2: the device and <dev>_dma
ALONE = 1                    # 2.27.6-2.27.7: only exactly 1 opens <dev>_dma alone
SUFFIX = "_dma"              # init.cc: snprintf(devName, "%s_dma", devices[d]->name)
ORDINARY, DATA_DIRECT = "ordinary", "data-direct"
DMABUF_REFUSALS = (errno.EOPNOTSUPP, errno.EPROTONOSUPPORT)
SYSFS = "/sys"
LOOKUP = "mlx5dv_get_data_direct_sysfs_path"
# A refused registration on <dev>_dma: the job's registration fails the same way.
REFUSED_CAUSE = (f"NCCL's only registration on <dev>{SUFFIX}, mlx5dv_reg_dmabuf_mr with "
                 "MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT, was refused, so the job's registrations fail too")
REFUSED_FIX = (f"NCCL registers on <dev>{SUFFIX} only through mlx5dv_reg_dmabuf_mr with "
               "MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT: update the NIC's firmware, the kernel's mlx5_ib and "
               f"rdma-core together, or set {VARIABLE}=0 so that NCCL opens the device itself and registers "
               "through ibv_reg_dmabuf_mr")


@dataclasses.dataclass(frozen=True)
class DataDirectProbe:
    """What NCCL's sequence finds for one RDMA device (the doctor runs it: the
    ``data_direct`` facts of :mod:`gdrprobe.doctor.facts.nic_facts`)."""

    path: str | None          # the data-direct device's sysfs path, /sys prefixed; None: not data-direct
    reason: str               # why it is, or is not
    breaks_init: bool = False  # the lookup failed other than with ENODEV (2.28.3+: NCCL's IB stops)


def read_probe(result: Mapping[str, Any] | None, library_error: str | None = None) -> DataDirectProbe:
    """One device's captured result: ``{"mlx5": bool, "dmabuf_errno": int|None,
    "path": str|None, "errno": int|None}`` or ``{"error": why}``; ``library_error`` where
    libmlx5 could not be asked at all."""
    if library_error is not None:
        return DataDirectProbe(None, f"not data-direct: {library_error}")
    if not result:
        return DataDirectProbe(None, "not data-direct: no data-direct probe was captured")
    if "error" in result:
        return DataDirectProbe(None, f"not data-direct: the probe failed ({result['error']})")
    if not result.get("mlx5"):
        return DataDirectProbe(None, "not data-direct: libmlx5 does not drive it (mlx5dv_is_supported)")
    refused = result.get("dmabuf_errno")
    if refused in DMABUF_REFUSALS:
        return DataDirectProbe(None, f"not data-direct: mlx5dv_reg_dmabuf_mr(fd=-1) failed with "
                                     f"{errno_label(refused)} (init.cc ncclMlx5dvDmaBufCapable)")
    if result.get("path"):
        return DataDirectProbe(SYSFS + result["path"], f"{LOOKUP} gives {result['path']}")
    code = result.get("errno")
    name = errno_label(code)
    if code == errno.ENODEV:
        return DataDirectProbe(None, f"not data-direct: {LOOKUP} says ENODEV")
    return DataDirectProbe(None, f"{LOOKUP} failed with {name}", breaks_init=True)


def setting(environ: Mapping[str, str]) -> int:
    return params.IB_DATA_DIRECT.number(environ)


def exposed(rules: NcclRules, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Which of a data-direct device's two faces NCCL opens (ORDINARY, DATA_DIRECT), in
    NCCL's order, under this release and environment."""
    if not rules.since(DATA_DIRECT_SINCE):
        return (ORDINARY,)
    value = setting(environ)
    if not rules.since(DATA_DIRECT_ALONE_SINCE):
        return (ORDINARY, DATA_DIRECT) if value != 0 else (ORDINARY,)
    if not rules.since(DATA_DIRECT_LOOKUP_FATAL_SINCE):
        return {ALONE: (DATA_DIRECT,), BOTH: (ORDINARY, DATA_DIRECT)}.get(value, (ORDINARY,))
    if value <= 0:
        return (ORDINARY,)
    return (ORDINARY, DATA_DIRECT) if value == BOTH else (DATA_DIRECT,)


def asks(rules: NcclRules, environ: Mapping[str, str]) -> bool:
    """Whether a lookup error can stop NCCL's IB transport: 2.28.3 on, the variable positive."""
    return rules.since(DATA_DIRECT_LOOKUP_FATAL_SINCE) and setting(environ) > 0


def breaks_init(rules: NcclRules, environ: Mapping[str, str], probe: DataDirectProbe,
                ports: tuple[Port, ...] | None = None, nic: str = "") -> bool:
    """Whether this device's lookup error stops NCCL's IB transport: the release and the
    variable make NCCL ask (:func:`asks`), and NCCL opens a port of it (ports: the device's,
    as sysfs lists them; None or none listed: taken as opened, as :mod:`gdrprobe.nccl.nets`
    takes such a device)."""
    if not (probe.breaks_init and asks(rules, environ)):
        return False
    hca = params.IB_HCA.raw(environ)
    kept = parse_hca_filter(hca) if hca is not None else None
    if ports:
        return bool(nccl_ports(nic, ports, kept))
    return kept is None or kept.selects(nic)


def ib_init_failure(rules: NcclRules, environ: Mapping[str, str], errors: Mapping[str, str],
                    ports: Mapping[str, tuple[Port, ...]]) -> str | None:
    """Why NCCL's IB transport does not start on this node (errors: RDMA device -> its lookup
    error; ports: each device's), or None."""
    failed = [nic for nic, error in errors.items()
              if breaks_init(rules, environ, DataDirectProbe(None, error, True), ports.get(nic), nic)]
    if not failed:
        return None
    nic = failed[0]
    where = "net_ib/init.cc" if rules.since((2, 29, 2)) else "net_ib.cc"
    after = ("NCCL_NET names IB, so NCCL finds no network and the job fails to start"
             if (params.NET.raw(environ) or "").lower() == "ib"
             else "NCCL moves the job to its socket transport, through host memory (plugin/net.cc ncclNetInit)")
    return (f"{rules.described} cannot start its InfiniBand/RoCE transport: {errors[nic]} on {nic}, and from "
            f"2.28.3 any result but success or ENODEV stops ncclIbInitDevices ({where}; mlx5dvwrap.cc): {after}")


def why_exposed(rules: NcclRules, environ: Mapping[str, str]) -> str:
    """The rule that chose :func:`exposed`, in words."""
    raw = params.IB_DATA_DIRECT.raw(environ)
    said = f"{VARIABLE}={raw}" if raw is not None else f"{VARIABLE} unset (default {DEFAULT})"
    if not rules.since(DATA_DIRECT_SINCE):
        return f"{rules.described} predates data-direct devices (2.27.3): {VARIABLE} is ignored"
    faces = exposed(rules, environ)
    where = "net_ib/init.cc" if rules.since((2, 29, 2)) else "net_ib.cc"
    if faces == (ORDINARY,):
        return f"{said}: {rules.described} opens the device alone, not <dev>{SUFFIX} ({where} ncclIbInitDevices)"
    opened = (f"only <dev>{SUFFIX}, at the data-direct path" if faces == (DATA_DIRECT,)
              else f"the device and <dev>{SUFFIX}")
    return f"{said}: {rules.described} opens {opened} ({where} ncclIbInitDevices)"


def placement_note(label: str, ibdev: str, bdf: str, rules: NcclRules, environ: Mapping[str, str]) -> str:
    """What a decision says of a data-direct network device it chose."""
    return (f"{label} is {ibdev}'s data-direct device, placed at {bdf} where libmlx5 puts it "
            f"({LOOKUP}); {why_exposed(rules, environ)}")


def nccl_face(rules: NcclRules, environ: Mapping[str, str], decided: bool | None) -> tuple[str, str]:
    """(face, why): the face of a data-direct NIC on which NCCL registers a GPU's DMA-BUF,
    DATA_DIRECT (``<dev>_dma``: mlx5dv_reg_dmabuf_mr with DATA_DIRECT, no fallback) or
    ORDINARY (the device: ibv_reg_dmabuf_mr). Where the release and the variable open one
    face, it is that one on every data-direct NIC; where they open both, the decision for the
    GPU says which (decided: its network device is ``<dev>_dma``; None: no decision names a
    NIC for the GPU, and the face is "")."""
    faces = exposed(rules, environ)
    if len(faces) == 1:
        return faces[0], why_exposed(rules, environ)
    if decided is not None:
        name = f"<dev>{SUFFIX}" if decided else "the device itself"
        return (DATA_DIRECT if decided else ORDINARY,
                f"{why_exposed(rules, environ)}; NCCL's decision for this GPU uses {name}")
    return "", f"{why_exposed(rules, environ)}: which one a GPU's traffic takes is NCCL's decision for it"
