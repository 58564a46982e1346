"""The ways GPU memory can be registered with a NIC, tried in NCCL's order of preference,
and which one registered and why.

NVIDIA/nccl 2.30.7: a data-direct device (``<dev>_dma``, :mod:`gdrprobe.nccl.data_direct`)
registers a DMA-BUF with ``mlx5dv_reg_dmabuf_mr(..., MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)``
(``src/transport/net_ib/reg.cc`` ncclIbRegMrDmaBufInternal2); the device itself (what
NCCL_IB_DATA_DIRECT=0 leaves) with ``ibv_reg_dmabuf_mr``; without DMA-BUF NCCL registers the
GPU address for peer memory (``src/transport/net.cc`` useDmaBuf). NCCL itself does not fall
from one to the next inside one device: the rung is fixed by the device it opened and its
settings. gdrprobe climbs down the same order so that one run says which rung this node's
NIC takes and, for every rung above it, why not; the refusals are what NCCL would hit on
the devices that use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

DATA_DIRECT, DMABUF, PEERMEM = "data-direct", "dmabuf", "peermem"
CALLS = {DATA_DIRECT: "mlx5dv_reg_dmabuf_mr(MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)",
         DMABUF: "ibv_reg_dmabuf_mr", PEERMEM: "ibv_reg_mr on the GPU address (peer memory)"}


@dataclasses.dataclass(frozen=True)
class Rung:
    name: str            # DATA_DIRECT, DMABUF or PEERMEM
    why: str             # why this rung is on the ladder at all


@dataclasses.dataclass(frozen=True)
class Climbed:
    rung: Rung                                 # the rung that registered
    region: Any                                # its memory region
    refused: tuple[tuple[Rung, str], ...]      # the rungs above it, each with the refusal

    @property
    def reason(self) -> str:
        """Which rung registered and why, the refusals above it first."""
        above = "; ".join(f"{CALLS[rung.name]} refused ({why})" for rung, why in self.refused)
        took = f"registered through {CALLS[self.rung.name]} ({self.rung.why})"
        return f"{above}; then {took}" if above else took


class NoRungHeld(Exception):
    """Every rung refused: ``refused`` holds each with its refusal, ``last`` the final error."""

    def __init__(self, refused: tuple[tuple[Rung, str], ...], last: BaseException):
        super().__init__("; ".join(f"{CALLS[rung.name]}: {why}" for rung, why in refused))
        self.refused, self.last = refused, last


def ladder(data_direct_path: str | None, dmabuf: bool, peermem: bool) -> tuple[Rung, ...]:
    """The rungs in NCCL's order for a NIC with (or without) a data-direct path, where
    DMA-BUF and peer memory are each possible."""
    rungs = []
    if data_direct_path and dmabuf:
        rungs.append(Rung(DATA_DIRECT, f"the NIC is data-direct ({data_direct_path}): NCCL's <dev>_dma "
                                       "registers this way (net_ib/reg.cc)"))
    if dmabuf:
        rungs.append(Rung(DMABUF, "NCCL's registration for a DMA-BUF on a device that is not data-direct "
                                  "(net_ib/reg.cc)"))
    if peermem:
        rungs.append(Rung(PEERMEM, "NCCL's registration without DMA-BUF (net.cc useDmaBuf)"))
    return tuple(rungs)


def climb(rungs: Sequence[Rung], attempt: Callable[[Rung], Any],
          refusal: type[BaseException] | tuple[type[BaseException], ...]) -> Climbed:
    """Try each rung in order until one registers; ``refusal``: the errors that mean "this
    rung refused" (anything else is no refusal and propagates)."""
    refused: list[tuple[Rung, str]] = []
    last: BaseException | None = None
    for rung in rungs:
        try:
            return Climbed(rung, attempt(rung), tuple(refused))
        except refusal as error:
            refused.append((rung, str(error).splitlines()[0] if str(error) else type(error).__name__))
            last = error
    raise NoRungHeld(tuple(refused), last or LookupError("no rung to try"))
