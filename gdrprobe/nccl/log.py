"""Read an NCCL_DEBUG=INFO log: per NIC and channel, was GPUDirect RDMA used, and how?

What each NCCL line proves differs, and has changed across versions:

* ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA`` is the use itself: the
  connection of that channel went through NIC 0 with GPU memory registered for RDMA.
  Without ``/GDRDMA`` the data bounced through host memory. The line does not say whether
  the GPU memory was registered through DMA-BUF or nvidia-peermem.
* ``NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'`` is the NIC's capability, not
  its use: the GPU-NIC distance can still turn GDR off per pair.
* ``GPU Direct RDMA Disabled for GPU 0 / HCA 0 (distance 5 > 4)`` (the per-pair decision)
  is INFO up to 2.29 and TRACE-only from 2.30, so its absence there proves nothing.
* ``DMA-BUF is available on GPU device 0`` is the GPU side only; it prints even when GDR
  ends up off for every NIC.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from gdrprobe.errors import UsageError
from gdrprobe.report.model import ChannelUse, NcclLogReport, NicUse, PairDecision

VERSION_RE = re.compile(r"NCCL version (\d+)\.(\d+)\.(\d+)")
NIC_LIST_RE = re.compile(r"NET/(IB|Socket)\s*: Using (.*)")
NIC_ENTRY_RE = re.compile(r"\[(\d+)\]([^\s:\[\]]+)(?::(\d+))?(?:/(\w+))?")
NIC_GDR_RE = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for HCA (\d+) '([^']+)'")
PAIR_GDR_RE = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for GPU (\w+) / HCA (\w+) "
                         r"\(distance (\d+) ([<>]=?) (\d+)\)")
DMABUF_RE = re.compile(r"DMA-BUF is available on GPU device (\d+)")
CHANNEL_RE = re.compile(
    r"Channel (\d+)(?:/\d+)? : (\d+)\[(\w+)\] -> (\d+)\[(\w+)\] \[(send|receive)\] "
    r"via NET/(\w+)/(\d+)(?:\((\d+)\))?(\S*)"
)


# ---- line parsing -----------------------------------------------------------


def nic_list(message: str) -> dict[int, tuple[str, int | None, str | None]]:
    """``[0]mlx5_0:1/RoCE [1]mlx5_1:1/IB ; OOB ...`` -> {0: ("mlx5_0", 1, "RoCE"), ...}."""
    devices_part = message.split(";")[0]
    return {int(index): (name, int(port) if port else None, layer)
            for index, name, port, layer in NIC_ENTRY_RE.findall(devices_part)}


def channel_use(line_number: int, match: re.Match, names: dict[int, str]) -> ChannelUse:
    channel, rank, device, peer, peer_device, direction, transport, nic, proxy, suffix = match.groups()
    return ChannelUse(
        line=line_number, channel=int(channel), direction=direction,
        local=f"{rank}[{device}]", remote=f"{peer}[{peer_device}]",
        transport=transport, nic_index=int(nic), nic_name=names.get(int(nic)),
        proxy_rank=int(proxy) if proxy else None,
        gdrdma="/GDRDMA" in suffix, pci_mapping="(PCI)" in suffix, shared="/Shared" in suffix,
    )


@dataclasses.dataclass
class _Scan:
    """What the lines say, gathered in one pass before it is summarised."""

    version: tuple[int, int, int] | None = None
    nics: dict = dataclasses.field(default_factory=dict)          # index -> (name, port, layer)
    nic_gdr: dict = dataclasses.field(default_factory=dict)       # index -> bool
    channels: list = dataclasses.field(default_factory=list)
    pairs: list = dataclasses.field(default_factory=list)
    dmabuf_gpus: set = dataclasses.field(default_factory=set)
    saw_socket_list: bool = False


def scan(lines: Iterable[str]) -> _Scan:
    found = _Scan()
    for number, line in enumerate(lines, start=1):
        if found.version is None and (match := VERSION_RE.search(line)):
            found.version = tuple(int(part) for part in match.groups())
        elif match := NIC_LIST_RE.search(line):
            if match.group(1) == "Socket":
                found.saw_socket_list = True
            else:
                found.nics.update(nic_list(match.group(2)))
        elif match := NIC_GDR_RE.search(line):
            found.nic_gdr[int(match.group(2))] = match.group(1) == "Enabled"
        elif match := PAIR_GDR_RE.search(line):
            state, gpu, nic, distance, _op, level = match.groups()
            found.pairs.append(PairDecision(number, gpu, nic, state == "Enabled", int(distance), int(level)))
        elif match := DMABUF_RE.search(line):
            found.dmabuf_gpus.add(int(match.group(1)))
        elif match := CHANNEL_RE.search(line):
            names = {index: entry[0] for index, entry in found.nics.items()}
            found.channels.append(channel_use(number, match, names))
    return found


# ---- summarising ------------------------------------------------------------


def nic_uses(found: _Scan) -> tuple[NicUse, ...]:
    ib_channels = [channel for channel in found.channels if channel.transport == "IB"]
    uses = []
    for index, (name, port, layer) in sorted(found.nics.items()):
        mine = [channel for channel in ib_channels if channel.nic_index == index]
        gdr = sum(channel.gdrdma for channel in mine)
        uses.append(NicUse(index, name, port, layer, found.nic_gdr.get(index), gdr, len(mine) - gdr))
    return tuple(uses)


def verdict(channels: list[ChannelUse]) -> str:
    if not channels:
        return "no-net-channels"
    if all(channel.transport == "Socket" for channel in channels):
        return "socket"
    used = [channel.gdrdma for channel in channels]
    return "gdr-all" if all(used) else "gdr-some" if any(used) else "gdr-none"


def mechanism(found: _Scan) -> str:
    if not any(channel.gdrdma for channel in found.channels):
        return "none: no channel used GDRDMA"
    if found.dmabuf_gpus:
        return "DMA-BUF or nvidia-peermem: the GPU side offered DMA-BUF, the log does not say the NIC took it"
    return ("nvidia-peermem, most likely: no 'DMA-BUF is available' line (GPU without DMA-BUF, "
            "NCCL_DMABUF_ENABLE=0, or an NCCL that predates the line)")


def conclusions(found: _Scan, outcome: str) -> list[str]:
    said = []
    ib = [channel for channel in found.channels if channel.transport == "IB"]
    if outcome == "socket" or (found.saw_socket_list and not ib):
        said.append("NCCL used the socket transport: traffic went through host memory, no GPUDirect RDMA")
    if ib:
        gdr = sum(channel.gdrdma for channel in ib)
        said.append(f"{gdr} of {len(ib)} network channel connections used GPUDirect RDMA (/GDRDMA)")
    for index, capable in sorted(found.nic_gdr.items()):
        if capable is False:
            name = found.nics.get(index, (str(index),))[0]
            said.append(f"NCCL found GPUDirect RDMA unavailable for NIC {name} (no peer memory, no DMA-BUF)")
    for pair in found.pairs:
        if not pair.enabled:
            said.append(f"GDR off for GPU {pair.gpu} and NIC {pair.nic}: distance {pair.distance} > level {pair.level}")
    return said


def limits(found: _Scan, outcome: str, truncated: bool) -> list[str]:
    unsaid = []
    if outcome == "no-net-channels":
        unsaid.append("no network channel lines: a single-node run, or NCCL_DEBUG_SUBSYS excluded INIT; "
                      "whether GDR was used cannot be told from this log")
    if any(channel.gdrdma for channel in found.channels):
        unsaid.append("the channel lines do not say whether GPU memory was registered via DMA-BUF or nvidia-peermem")
    if found.dmabuf_gpus:
        unsaid.append("'DMA-BUF is available' describes the GPU only and prints even when GDR is off for every NIC")
    if not found.pairs and (found.version is None or found.version >= (2, 30, 0)):
        unsaid.append("per GPU-NIC pair decisions (distance against NCCL_NET_GDR_LEVEL) print only at TRACE "
                      "from NCCL 2.30; the channel lines are the evidence")
    if found.nic_gdr and any(found.nic_gdr.values()):
        unsaid.append("'GPU Direct RDMA Enabled for HCA' is the NIC's capability; the distance can still "
                      "turn GDR off per GPU")
    if truncated:
        unsaid.append("the log was longer than the read limit; only its beginning was read")
    return unsaid


def parse_nccl_log(text: str, source: str = "", truncated: bool = False) -> NcclLogReport:
    found = scan(text.splitlines())
    outcome = verdict(found.channels)
    return NcclLogReport(
        source=source,
        nccl_version=".".join(map(str, found.version)) if found.version else None,
        verdict=outcome,
        mechanism=mechanism(found),
        nics=nic_uses(found),
        channels=tuple(found.channels),
        pair_decisions=tuple(found.pairs),
        dmabuf_gpus=tuple(sorted(found.dmabuf_gpus)),
        conclusions=tuple(conclusions(found, outcome)),
        cannot_conclude=tuple(limits(found, outcome, truncated)),
    )


# NCCL INFO logs of large jobs run to tens of MiB; more than this is read only in part.
MAX_LOG_BYTES = 64 << 20


def read_bounded(path: str) -> tuple[str, bool]:
    """The text of the log (at most MAX_LOG_BYTES) and whether it was cut."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_LOG_BYTES + 1)
    except OSError as error:
        raise UsageError(f"cannot read NCCL log {path}: {error.strerror}",
                         fix="pass the file the job wrote with NCCL_DEBUG=INFO (NCCL_DEBUG_FILE names it)") from None
    return data[:MAX_LOG_BYTES].decode("utf-8", "replace"), len(data) > MAX_LOG_BYTES


def read_nccl_log(path: str) -> NcclLogReport:
    """What the log at path proves (at most MAX_LOG_BYTES of it are read)."""
    text, truncated = read_bounded(path)
    return parse_nccl_log(text, source=path, truncated=truncated)
