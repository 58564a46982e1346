"""Where NCCL's environment alone keeps every GPU off GPUDirect RDMA, whatever the node's
topology (so the answer holds where the topology could not be read): no RDMA transport at
all (NCCL_IB_DISABLE, NCCL_NET naming the socket transport), or a GDR level below every
distance a GPU can have to a NIC. The per-GPU decision (:mod:`gdrprobe.nccl.decision`) asks
these first; the check (:mod:`gdrprobe.campaign.nccl_use`) blames the settings they name.
"""

from __future__ import annotations

from collections.abc import Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.versions import NcclRules


def transport_refusal(environ: Mapping[str, str], rules: NcclRules | None = None) -> str | None:
    """Why NCCL uses no RDMA transport at all under this environment, or None: with
    NCCL_IB_DISABLE non-zero its IB transport does not start (``src/transport/net_ib/init.cc``
    ncclIbInitDevices, ``net_ib.cc`` ncclIbInit in older releases: ``if
    (ncclParamIbDisable()) return ncclInternalError``), and NCCL_NET naming the socket transport picks it by name
    (:meth:`gdrprobe.nccl.versions.NcclRules.selects_socket`): every byte then goes through
    host memory."""
    rules = rules or NcclRules()
    if params.IB_DISABLE.number(environ) != 0:
        return (f"NCCL_IB_DISABLE={params.IB_DISABLE.raw(environ)} turns NCCL's InfiniBand/RoCE transport off "
                "(net_ib/init.cc ncclIbInitDevices): NCCL sends through sockets in host memory")
    if rules.selects_socket(environ):
        return (f"NCCL_NET={params.NET.raw(environ)} selects the socket transport (plugin/net.cc ncclNetInit): "
                "NCCL sends through host memory")
    return None


def level_refusal(environ: Mapping[str, str], rules: NcclRules | None = None) -> str | None:
    """A GDR level below every distance a GPU can have to a NIC (LOC, NVL, NVB; C2C too
    where the release does not count a C2C path as C2C): GPUDirect RDMA is off for every GPU
    whatever the topology (paths.cc ncclTopoCheckGdr: ``distance > netGdrLevel``)."""
    rules = rules or NcclRules()
    level = rules.gdr_level(environ)
    if level.raw is None or any(level.admits(d) for d in rules.nearest_gdr_distances(environ)):
        return None
    return (f"NCCL_NET_GDR_LEVEL={level.raw} means {level.name}: no NIC is that close to a GPU, so NCCL "
            "turns GPUDirect RDMA off for every GPU (paths.cc ncclTopoCheckGdr)")


def environment_refusal(environ: Mapping[str, str], rules: NcclRules | None = None) -> str | None:
    """Why NCCL's environment alone keeps every GPU off GPUDirect RDMA, whatever the
    topology (so it holds where the topology could not be read), or None."""
    return transport_refusal(environ, rules) or level_refusal(environ, rules)
