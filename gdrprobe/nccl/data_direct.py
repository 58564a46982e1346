"""mlx5 data-direct devices as NCCL's IB transport makes them, by NVIDIA/nccl release (the
first tag with each rule; ``src/transport/net_ib.cc`` until 2.28.x, ``net_ib/init.cc`` from
2.29.2, ncclIbInitDevices):

- An RDMA device is data-direct to NCCL when libmlx5 drives it (``mlx5dv_is_supported``),
  ``mlx5dv_reg_dmabuf_mr`` and ``ibv_reg_dmabuf_mr`` with fd -1 do not fail with EOPNOTSUPP
  or EPROTONOSUPPORT (ncclMlx5dvDmaBufCapable; a libmlx5 without the ``MLX5_1.25`` symbols
  counts as EOPNOTSUPP: ``src/misc/mlx5dvwrap.cc`` wrap_direct_mlx5dv_reg_dmabuf_mr), and
  ``mlx5dv_get_data_direct_sysfs_path`` (``MLX5_1.25``) returns a path. libmlx5 gives it
  without the ``/sys`` prefix (rdma-core providers/mlx5/man/mlx5dv_get_data_direct_sysfs_path.3.md).
- Such a device is exposed to NCCL twice: as itself, placed at its own PCI function, and as
  ``<dev>_dma``, placed at the data-direct path, registering GPU memory with
  ``mlx5dv_reg_dmabuf_mr(..., MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)`` (``reg.cc``) and
  flushed on every receive (:mod:`gdrprobe.nccl.flush`).
- NCCL_IB_DATA_DIRECT (default 1) chooses which exist. 2.27.3-2.27.7: any non-zero value
  both, 0 the device alone; a failing path lookup means not data-direct. From 2.28.3: 0 or
  below the device alone, 2 both, any other positive value ``<dev>_dma`` alone; ENODEV from
  the lookup means not data-direct (``mlx5dvwrap.cc``), any other error stops NCCL's IB
  transport from starting ("Error in mlx5dv_get_data_direct_sysfs_path", NVIDIA/nccl
  issue 1866).
- Before 2.27.3 NCCL knows nothing of data-direct: the variable is ignored.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Mapping
from typing import Any

from gdrprobe.errors import errno_label
from gdrprobe.nccl import params
from gdrprobe.nccl.versions import DATA_DIRECT_ONLY_SINCE, DATA_DIRECT_SINCE, NcclRules

VARIABLE = params.IB_DATA_DIRECT.name
DEFAULT = params.IB_DATA_DIRECT.default()
BOTH = 2                     # NCCL_IB_DATA_DIRECT=2: the device and <dev>_dma (2.28.3 on)
SUFFIX = "_dma"              # init.cc: snprintf(devName, "%s_dma", devices[d]->name)
ORDINARY, DATA_DIRECT = "ordinary", "data-direct"
DMABUF_REFUSALS = (errno.EOPNOTSUPP, errno.EPROTONOSUPPORT)
SYSFS = "/sys"


@dataclasses.dataclass(frozen=True)
class DataDirectProbe:
    """What NCCL's sequence finds for one RDMA device (the doctor runs it: the
    ``data_direct`` facts of :mod:`gdrprobe.doctor.facts.nic_facts`)."""

    path: str | None          # the data-direct device's sysfs path, /sys prefixed; None: not data-direct
    reason: str               # why it is, or is not
    breaks_init: bool = False  # a lookup error other than ENODEV: NCCL 2.28.3+ stops its IB transport


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
        return DataDirectProbe(SYSFS + result["path"], f"mlx5dv_get_data_direct_sysfs_path gives {result['path']}")
    code = result.get("errno")
    name = errno_label(code)
    if code == errno.ENODEV:
        return DataDirectProbe(None, "not data-direct: mlx5dv_get_data_direct_sysfs_path says ENODEV")
    return DataDirectProbe(None, f"mlx5dv_get_data_direct_sysfs_path failed with {name}", breaks_init=True)


def setting(environ: Mapping[str, str]) -> int:
    return params.IB_DATA_DIRECT.number(environ)


def exposed(rules: NcclRules, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Which of a data-direct device's two faces NCCL opens (ORDINARY, DATA_DIRECT), in
    NCCL's order, under this release and environment."""
    if not rules.since(DATA_DIRECT_SINCE):
        return (ORDINARY,)
    value = setting(environ)
    if not rules.since(DATA_DIRECT_ONLY_SINCE):
        return (ORDINARY, DATA_DIRECT) if value != 0 else (ORDINARY,)
    if value <= 0:
        return (ORDINARY,)
    return (ORDINARY, DATA_DIRECT) if value == BOTH else (DATA_DIRECT,)


def breaks_init(rules: NcclRules, environ: Mapping[str, str], probe: DataDirectProbe) -> bool:
    """Whether this device's lookup error stops NCCL's IB transport (2.28.3 on, while the
    variable is positive: NCCL asks only then)."""
    return probe.breaks_init and rules.since(DATA_DIRECT_ONLY_SINCE) and setting(environ) > 0


def why_exposed(rules: NcclRules, environ: Mapping[str, str]) -> str:
    """The rule that chose :func:`exposed`, in words."""
    raw = environ.get(VARIABLE)
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
            f"(mlx5dv_get_data_direct_sysfs_path); {why_exposed(rules, environ)}")
