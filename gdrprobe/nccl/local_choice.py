"""NCCL's GPU-to-NIC and NIC-to-GPU paths, and the endpoints local to each, kept as the paths
change (issue 43 item 5).

``ncclTopoGetLocal`` (``src/graph/topo.cc``) names the endpoints local to another: those of
the highest bandwidth, then the lowest path type, in index order. NCCL asks it again for
every GPU-NIC pair of its NIC loop (ncclTopoComputePaths through ncclTopoGetLocalGpu, per
channel), which in C over a handful of NICs costs nothing; asked from scratch in Python,
one RDMA device with 800 ports (each port is a network device to NCCL) took 8.7 s, 3,000
ports over 25 s. So each endpoint's local set is computed once and then updated with each
path the loop changes (PXN, the detour through the CPU): a better path starts a new set, an
equal one joins it in index order, a worse one leaves it, and only a set left empty is
computed again. The answer is NCCL's; the cost is linear in the paths the loop visits.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from typing import Any


def local(options: Mapping[Any, Any], rank: Mapping[str, int]) -> list:
    """ncclTopoGetLocal over one endpoint's paths (``{endpoint: PairPath}``): the highest
    bandwidth, then the lowest path type, in index order."""
    return LocalSet(options, rank).members


class LocalSet:
    """ncclTopoGetLocal's answer over ``options``, kept as its paths change (:meth:`changed`).
    ``members`` is read-only, and stays valid until the next change."""

    def __init__(self, options: Mapping[Any, Any], rank: Mapping[str, int]):
        self.options, self.rank = options, rank
        self.order = {key: index for index, key in enumerate(options)}
        self._recompute()

    def value(self, path) -> tuple[float, int]:
        """What ncclTopoGetLocal compares: bandwidth first, then the lower path type."""
        return path.bw, -self.rank[path.type]

    def _recompute(self) -> None:
        self.best = max((self.value(path) for path in self.options.values()), default=None)
        self.members = [key for key, path in self.options.items() if self.value(path) == self.best]
        self.positions = [self.order[key] for key in self.members]

    def index(self, key) -> int | None:
        """Where key stands among the members (None: not one)."""
        at = bisect.bisect_left(self.positions, self.order[key])
        return at if at < len(self.positions) and self.positions[at] == self.order[key] else None

    def changed(self, key) -> None:
        """options[key] was just replaced."""
        value, position = self.value(self.options[key]), self.order[key]
        at = self.index(key)
        if self.best is None or value > self.best:
            self.best, self.members, self.positions = value, [key], [position]
        elif value == self.best:
            if at is None:
                at = bisect.bisect_left(self.positions, position)
                self.positions.insert(at, position)
                self.members.insert(at, key)
        elif at is not None:
            del self.positions[at], self.members[at]
            if not self.members:
                self._recompute()


@dataclasses.dataclass
class Paths:
    """NCCL's GPU-to-NIC and NIC-to-GPU paths (``gpu->paths[NET]``, ``net->paths[GPU]``):
    PXN changes only the first, the detour through the CPU both. Change them through
    :meth:`set_to_net` and :meth:`set_to_gpu`, so the local sets follow."""

    to_net: dict[Any, dict[Any, Any]]
    to_gpu: dict[Any, dict[Any, Any]]
    rank: Mapping[str, int]
    _local: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def local_nets(self, gpu) -> list:
        return self._set(gpu, self.to_net).members

    def local_gpus(self, net) -> list:
        return self._set(net, self.to_gpu).members

    def local_net_index(self, gpu, net) -> int | None:
        """Where net stands among the GPU's local NICs (None: not one of them)."""
        return self._set(gpu, self.to_net).index(net)

    def set_to_net(self, gpu, net, path) -> None:
        self.to_net[gpu][net] = path
        if gpu in self._local:
            self._local[gpu].changed(net)

    def set_to_gpu(self, net, gpu, path) -> None:
        self.to_gpu[net][gpu] = path
        if net in self._local:
            self._local[net].changed(gpu)

    def _set(self, endpoint, table: dict) -> LocalSet:
        if endpoint not in self._local:
            self._local[endpoint] = LocalSet(table[endpoint], self.rank)
        return self._local[endpoint]
