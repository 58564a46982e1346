"""NCCL's DMA-BUF probe run on every PCI RDMA NIC of the live machine, as JSON-ready facts.

NCCL decides DMA-BUF per NIC by calling ``ibv_reg_dmabuf_mr`` with fd -1 (NCCL 2.30.7
``src/transport/net_ib/gdr.cc``, ibDmaBufSupportInitOnce); nothing in sysfs says the same,
so the doctor runs the same probe through pyverbs (:mod:`gdrprobe.memory.nic_probe`) and
the capture stores the errno each NIC gave, for a replay to read back.

Result: ``{"dmabuf_probe": {"mlx5_0": {"errno": 9}, ...}}`` (``errno`` null: the dummy
registration succeeded) or, per NIC, ``{"error": reason}`` when the probe could not run;
``{"error": reason}`` alone when pyverbs is missing.

Beside it, ``"data_direct"``: NCCL's data-direct sequence on each NIC through libmlx5
(:func:`gdrprobe.rdma.mlx5dv.probe_data_direct`; ``{"devices": {...}}`` or ``{"error": why}``),
read by :mod:`gdrprobe.nccl.data_direct`; a capture without it replays as no data-direct.
"""

from __future__ import annotations

import errno
from typing import Any

from gdrprobe.errors import GdrprobeError


def probe_device(pv, device: str) -> dict[str, Any]:
    from gdrprobe.memory.nic_probe import probe_nic_dmabuf

    if not hasattr(pv.mr, "DmaBufMR"):
        # rdma-core before 34 has no ibv_reg_dmabuf_mr: NCCL's wrapper then sets EOPNOTSUPP.
        return {"errno": errno.EOPNOTSUPP}
    try:
        with pv.device.Context(name=device) as context, pv.pd.PD(context) as pd:
            return {"errno": probe_nic_dmabuf(pd).errno}
    except pv.PyverbsError as error:
        return {"error": f"opening {device} for the probe failed: {error}"}


def collect_nic_facts(devices: list[str]) -> dict[str, Any]:
    from gdrprobe.rdma import verbs
    from gdrprobe.rdma.mlx5dv import probe_data_direct

    data_direct = probe_data_direct(devices)
    try:
        pv = verbs.pyverbs()
    except GdrprobeError as error:
        return {"error": error.cause, "data_direct": data_direct}
    return {"dmabuf_probe": {device: probe_device(pv, device) for device in devices}, "data_direct": data_direct}
