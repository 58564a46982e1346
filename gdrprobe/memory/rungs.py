"""The ways GPU memory can be registered with a NIC, tried in NCCL's order of preference,
and which one registered and why.

NVIDIA/nccl 2.27.3 on: a data-direct device (``<dev>_dma``, :mod:`gdrprobe.nccl.data_direct`)
registers a DMA-BUF with ``mlx5dv_reg_dmabuf_mr(..., MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)``
and nothing else (``src/transport/net_ib/reg.cc`` ncclIbRegMrDmaBufInternal2; ``net_ib.cc``
before 2.29.2); the device itself with ``ibv_reg_dmabuf_mr``; without DMA-BUF NCCL registers
the GPU address for peer memory (``src/transport/net.cc`` useDmaBuf). NCCL does not fall from
one to the next inside one device: the rung is fixed by the face of the NIC it opened for the
GPU (``face``: :func:`gdrprobe.nccl.data_direct.nccl_face`). So on the face NCCL chose, the
ladder holds that face's rung alone and a refusal is the job's (no fallback); where the face is
not known (NCCL opens both and no decision says which), gdrprobe climbs down the same order so
that one run says which rung this node's NIC takes and, for every rung above it, why not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from gdrprobe.nccl.data_direct import DATA_DIRECT as DATA_DIRECT_FACE
from gdrprobe.nccl.data_direct import ORDINARY

DATA_DIRECT, DMABUF, PEERMEM = "data-direct", "dmabuf", "peermem"
CALLS = {DATA_DIRECT: "mlx5dv_reg_dmabuf_mr(MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)",
         DMABUF: "ibv_reg_dmabuf_mr", PEERMEM: "ibv_reg_mr on the GPU address (peer memory)"}


@dataclasses.dataclass(frozen=True)
class Rung:
    name: str            # DATA_DIRECT, DMABUF or PEERMEM
    why: str             # why this rung is on the ladder at all
    alone: bool = False  # NCCL makes this registration alone on its face: no fallback


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


def ladder(data_direct_path: str | None, dmabuf: bool, peermem: bool, face: str = "",
           face_reason: str = "") -> tuple[Rung, ...]:
    """The rungs in NCCL's order for a NIC with (or without) a data-direct path, where
    DMA-BUF and peer memory are each possible; on a data-direct NIC, ``face`` (DATA_DIRECT or
    ORDINARY of :mod:`gdrprobe.nccl.data_direct`, "" not known) keeps the one NCCL registers
    through, ``face_reason`` says why."""
    rungs = []
    data_direct = bool(data_direct_path and dmabuf)
    if data_direct and face != ORDINARY:
        alone = face == DATA_DIRECT_FACE
        why = (f"NCCL registers on <dev>_dma through this call alone, no fallback (net_ib/reg.cc): {face_reason}"
               if alone else f"the NIC is data-direct ({data_direct_path}): NCCL's <dev>_dma registers this way "
                             "(net_ib/reg.cc)")
        rungs.append(Rung(DATA_DIRECT, why, alone))
    if dmabuf and not (data_direct and face == DATA_DIRECT_FACE):
        why = (f"NCCL registers on the data-direct NIC's device itself, not <dev>_dma ({face_reason})"
               if data_direct and face == ORDINARY
               else "NCCL's registration for a DMA-BUF on a device that is not data-direct (net_ib/reg.cc)")
        rungs.append(Rung(DMABUF, why))
    if peermem:
        rungs.append(Rung(PEERMEM, "NCCL's registration without DMA-BUF (net.cc useDmaBuf)"))
    return tuple(rungs)


def said(failed: NoRungHeld) -> str:
    """Every refusal, and for a rung NCCL makes alone why there is no other to try."""
    return "; ".join([str(failed)] + [rung.why for rung, _ in failed.refused if rung.alone])


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
