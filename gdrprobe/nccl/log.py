"""Read an NCCL_DEBUG=INFO log: per NIC and channel, was GPUDirect RDMA used, and how?

What each NCCL line proves differs, and has changed across versions (the formats, with the
source that prints each, are in :mod:`gdrprobe.nccl.log_formats`):

* ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA`` (``Ring 00 : 0 -> 1 ...`` up to
  2.6, ``CollNet ... via COLLNET/SHARP/0`` for SHARP) is the use itself: that connection
  went through NIC 0 with GPU memory registered for RDMA. Without ``/GDRDMA`` the data
  bounced through host memory. A line cut before its suffix proves neither.
* ``NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'`` is the NIC's capability, not its
  use: the GPU-NIC distance can still turn GDR off per pair.
* ``GPU Direct RDMA Disabled for GPU 0 / HCA 0 (distance 5 > 4)`` (the per-pair decision) is
  INFO up to 2.29 and TRACE-only from 2.30, so its absence there proves nothing.
* ``DMA-BUF is available on GPU device 0`` is the GPU side only; it prints even when GDR ends
  up off for every NIC. With a plugin's ``GPU Direct RDMA (DMABUF) enabled for HCA 0`` it
  does prove the registration path (``net.cc``: useDmaBuf).

The file is streamed: memory stays bounded whatever its size; the channel lines themselves
are kept only when asked for.
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Iterator

from gdrprobe.errors import UsageError
from gdrprobe.nccl import log_formats as formats
from gdrprobe.nccl.log_summary import GDR_ENV, build_report
from gdrprobe.report.nccl_log import NcclLogReport

BLOCK_BYTES = 1 << 20        # read this much at a time
MAX_LINE_BYTES = 1 << 20     # a longer "line" is read in pieces (memory stays bounded)
EXAMPLES = 3                 # unrecognised lines quoted in the report
EXAMPLE_CHARS = 200
READ_FIX = "pass the file the job wrote with NCCL_DEBUG=INFO (NCCL_DEBUG_FILE names it)"


class NicTally:
    """What the log says about one NIC of one host."""

    __slots__ = ("name", "port", "link_layer", "members", "plugins", "enabled", "disabled",
                 "reasons", "paths", "gdrdma", "host_memory", "unknown")

    def __init__(self) -> None:
        self.name = self.port = self.link_layer = None
        self.members: tuple[str, ...] = ()
        self.plugins: dict[str, None] = {}
        self.enabled = self.disabled = 0             # "GPU Direct RDMA Enabled/Disabled for HCA"
        self.reasons: dict[str, None] = {}
        self.paths: dict[str, None] = {}             # what a plugin offers: DMA-BUF, nvidia-peermem
        self.gdrdma = self.host_memory = self.unknown = 0


@dataclasses.dataclass
class Scan:
    """What the lines say, gathered in one pass; bounded by the number of distinct NICs,
    GPU-NIC pairs and hosts, not by the length of the log (unless lines are kept)."""

    keep_lines: bool = False
    versions: dict = dataclasses.field(default_factory=dict)        # (major, minor, patch)
    hosts: dict = dataclasses.field(default_factory=dict)           # the records' hosts, first seen first
    nics: dict = dataclasses.field(default_factory=dict)            # (host, space, index) -> NicTally
    channels: list = dataclasses.field(default_factory=list)        # kept lines: see read_channel
    local_channels: int = 0
    pairs: dict = dataclasses.field(default_factory=dict)           # decision key -> count
    dmabuf_gpus: dict = dataclasses.field(default_factory=dict)     # (host, device)
    env: dict = dataclasses.field(default_factory=dict)             # name -> {value}
    networks: dict = dataclasses.field(default_factory=dict)        # "Using network X"
    no_device: dict = dataclasses.field(default_factory=dict)       # host -> None
    ofi_gdr_off: dict = dataclasses.field(default_factory=dict)     # host -> reason
    ofi_dmabuf: dict = dataclasses.field(default_factory=dict)      # host -> bool
    ring_gdr: dict = dataclasses.field(default_factory=dict)        # GDR 0/1 -> count
    formats: dict = dataclasses.field(default_factory=dict)         # (name, versions) -> count
    unrecognised: int = 0
    examples: list = dataclasses.field(default_factory=list)        # (line, text)
    cut_lines: int = 0
    lines: int = 0
    saw_nccl: bool = False

    def nic(self, host: str, space: str, index: int) -> NicTally:
        key = (host, space, index)
        tally = self.nics.get(key)
        if tally is None:
            tally = self.nics[key] = NicTally()
        return tally


# ---- reading the file ----------------------------------------------------------------------


NCCL_MARK = re.compile(rb"NCCL (?:INFO|WARN|TRACE) |NCCL version \d")
CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")   # not tab, line ends, form feed, ESC


def blocks(handle, head: bytes, scan: Scan) -> Iterator[tuple[int, list[bytes], bool]]:
    """The file's lines a block at a time, starting with the head already read (so a pipe,
    <(zcat log.gz), reads too): the number of the block's first line, its lines, and whether
    the last of them ended without a line end (the end of the file, or a line longer than
    MAX_LINE_BYTES read in pieces). Memory: a block and a line at most."""
    number, tail, block = 1, b"", head
    while block:
        if not scan.saw_nccl:
            scan.saw_nccl = NCCL_MARK.search(tail[-32:] + block) is not None
        lines = (tail + block).split(b"\n")
        tail = lines.pop()
        cut = len(tail) > MAX_LINE_BYTES
        if cut:
            lines.append(tail)
            tail = b""
        yield number, lines, cut
        number += len(lines)
        block = handle.read(BLOCK_BYTES)
    if tail:
        yield number, [tail], True
        number += 1
    scan.lines = number - 1


def check_text(head: bytes, path: str) -> None:
    """Refuse what is not a text log, naming what it is."""
    if not head:
        raise UsageError(f"NCCL log {path} is empty", fix=READ_FIX)
    if head[:2] == b"\x1f\x8b":
        raise UsageError(f"NCCL log {path} is gzip-compressed",
                         fix=f"read it through a pipe: gdrprobe nccl-log <(zcat {path})")
    text = head.decode("utf-8", "replace")
    odd = text.count("\ufffd") + len(CONTROL_BYTES.findall(head))
    if b"\0" in head or odd > len(text) // 10:
        raise UsageError(f"NCCL log {path} is not text (binary data)", fix=READ_FIX)


def scan_file(handle, path: str, keep_lines: bool) -> Scan:
    head = handle.read(BLOCK_BYTES)
    check_text(head, path)
    scan = Scan(keep_lines=keep_lines)
    keywords, fast = formats.KEYWORDS.search, formats.FAST_LINE.fullmatch
    counts: dict[tuple, int] = {}       # the fast lines' groups (bytes) -> how many
    for first, lines, last_cut in blocks(handle, head, scan):
        if last_cut:
            scan.cut_lines += bool(lines[-1].strip())
        last = len(lines) - 1
        for offset, raw in enumerate(lines):
            whole = offset < last or not last_cut
            if whole and not keep_lines and (match := fast(raw)):
                # Most lines of a large log: counted here, folded onto their NICs at the end.
                if match.group(5):
                    scan.local_channels += 1
                    continue
                key = match.groups()
                if key not in counts:
                    counts[key] = 0
                    scan_host(scan, key[0].decode("utf-8", "replace"), glued=False)
                counts[key] += 1
            elif keywords(raw):
                read_line(scan, first + offset, raw.decode("utf-8", "replace").rstrip("\r"), whole)
    fold_fast_lines(scan, counts)
    if not scan.saw_nccl:
        raise UsageError(f"no NCCL line in {path}: no 'NCCL INFO' record and no 'NCCL version' line",
                         fix="run the job with NCCL_DEBUG=INFO and " + READ_FIX)
    return scan


def fold_fast_lines(scan: Scan, counts: dict[tuple, int]) -> None:
    """Count the lines read in one match (formats.FAST_LINE), tallied by their fields, as
    their readers count the others."""
    for groups, count in counts.items():
        host, net, nic, gdrdma, _, gdr_net, state, index, name = (
            None if group is None else group.decode("utf-8", "replace") for group in groups)
        line_format = formats.CHANNEL_FORMATS[0] if net else formats.NIC_GDR_FORMAT
        key = (line_format.name, line_format.versions)
        scan.formats[key] = scan.formats.get(key, 0) + count
        if net:
            count_channel(scan, host, net, int(nic), bool(gdrdma), count)
        else:
            count_nic_gdr(scan, host, gdr_net, int(index), name, state == "Enabled", None, count)


# ---- reading one line ----------------------------------------------------------------------


def read_line(scan: Scan, number: int, line: str, whole: bool) -> None:
    found = formats.records(line)
    for position, (host, message, glued) in enumerate(found):
        last = position == len(found) - 1
        # A record ends cut where the line does, or where the next one is glued on without
        # a space (something wrote over its end).
        cut = not whole if last else found[position + 1].glued
        read_message(scan, number, scan_host(scan, host, glued), message, cut)


def scan_host(scan: Scan, host: str, glued: bool) -> str:
    """The host a record came from. A record glued to the one before without a space may
    carry the end of that message in its host ("GDRDMAnode2"): a known host it ends with
    is taken instead."""
    if host in scan.hosts or not host:
        return host
    if glued:
        known = [name for name in scan.hosts if host.endswith(name)]
        if known:
            return max(known, key=len)
    scan.hosts[host] = None
    return host


def read_message(scan: Scan, number: int, host: str, message: str, cut: bool) -> None:
    matched = formats.match_message(message)
    if matched is None:
        if formats.LOCAL_CHANNEL.match(message):
            scan.local_channels += 1
        elif formats.CANDIDATE.search(message) and not cut:
            not_recognised(scan, number, message)
        return
    line_format, match = matched
    key = (line_format.name, line_format.versions)
    scan.formats[key] = scan.formats.get(key, 0) + 1
    READERS[line_format.name](scan, number, host, match, cut)


def not_recognised(scan: Scan, number: int, message: str) -> None:
    scan.unrecognised += 1
    if len(scan.examples) < EXAMPLES:
        scan.examples.append((number, message.strip()[:EXAMPLE_CHARS]))


def read_channel(scan: Scan, number: int, host: str, match, cut: bool, collnet: bool = False) -> None:
    rest = match.string[match.end():]
    if rest[:1] and not rest[:1].isspace():
        # Text right after the last field: the start of a suffix, cut ("/GDR"), or a suffix
        # no NCCL this reader knows prints.
        if not (cut or formats.suffix_cut(rest)):
            not_recognised(scan, number, match.string)
            return
        cut = True
    # A line cut before its suffix proves nothing about GDR: "/GDR" is not host memory.
    gdrdma = True if match.group("gdr") else None if cut else False
    transport = count_channel(scan, host, match.group("net"), int(match.group("nic")), gdrdma, 1,
                              collnet)
    if scan.keep_lines:
        scan.channels.append((number, host, match, gdrdma, collnet, transport))


def count_channel(scan: Scan, host: str, net: str, nic: int, gdrdma: bool | None, count: int,
                  collnet: bool = False) -> str:
    """Count channel lines on their NIC; returns their transport, normalised."""
    transport = formats.transport_of(net, collnet)
    tally = scan.nic(host, formats.nic_space(transport), nic)
    tally.plugins[net] = None
    if gdrdma is None:
        tally.unknown += count
    elif gdrdma:
        tally.gdrdma += count
    else:
        tally.host_memory += count
    return transport


def read_collnet(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    read_channel(scan, number, host, match, cut, collnet=True)


def read_nic_list(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    net = match.group("net")
    for index, (name, port, layer, members) in enumerate(formats.nic_list(match.group("devices"), net)):
        tally = scan.nic(host, net, index)
        tally.name, tally.port, tally.link_layer, tally.members = name, port, layer, members


def read_virtual_nic(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    tally = scan.nic(host, "IB", int(match.group("index")))
    tally.name = match.group("name")
    if int(match.group("ndevs")) > 1:
        tally.members = tuple(tally.name.split("+"))


def read_nic_gdr(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    count_nic_gdr(scan, host, match.group("net"), int(match.group("index")), match.group("name"),
                  match.group("state") == "Enabled", match.groupdict().get("reason"), 1)


def count_nic_gdr(scan: Scan, host: str, net: str, index: int, name: str, enabled: bool,
                  reason: str | None, count: int) -> None:
    tally = scan.nic(host, formats.nic_space(formats.transport_of(net)), index)
    tally.name = name
    tally.plugins[net] = None
    if enabled:
        tally.enabled += count
    else:
        tally.disabled += count
        tally.reasons[reason or formats.NEITHER_PATH] = None


def read_nic_path(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    tally = scan.nic(host, "IB", int(match.group("index")))
    tally.name = tally.name or match.group("name")
    tally.paths["DMA-BUF" if match.group("path") == "DMABUF" else "nvidia-peermem"] = None


def read_pair(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    fields = match.groupdict()
    key = (host, fields["gpu"], fields["nic"], fields["state"] == "Enabled", int(fields["distance"]),
           int(fields["level"]), f"{fields['distance']} {fields['op']} {fields['level']}",
           fields.get("read"), fields.get("mode"), fields.get("pxn"))
    scan.pairs[key] = scan.pairs.get(key, 0) + 1


def read_version(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.versions[tuple(int(part) for part in match.group("major", "minor", "patch"))] = None


def read_env(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    if match.group("name") in GDR_ENV:
        scan.env.setdefault(match.group("name"), {})[match.group("value").rstrip(".")] = None


def read_network(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.networks[match.group("net")] = None


def read_no_device(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.no_device[host] = None


def read_gpu_dmabuf(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.dmabuf_gpus[(host, int(match.group("device")))] = None


def read_ofi(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    if "reason" in match.groupdict():
        scan.ofi_gdr_off[host] = match.group("reason")
    else:
        scan.ofi_dmabuf[host] = match.group("supported") == "true"


def read_ring_summary(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    gdr = int(match.group("gdr"))
    scan.ring_gdr[gdr] = scan.ring_gdr.get(gdr, 0) + 1


READERS = {
    "channel": read_channel, "collnet": read_collnet, "nic-list": read_nic_list,
    "virtual-nic": read_virtual_nic, "nic-gdr": read_nic_gdr, "nic-path": read_nic_path,
    "pair-gdr": read_pair, "version": read_version, "env": read_env, "no-device": read_no_device,
    "network": read_network, "gpu-dmabuf": read_gpu_dmabuf, "ofi-gdr-off": read_ofi,
    "ofi-dmabuf": read_ofi, "ring-summary": read_ring_summary,
}


# ---- the public entry points ---------------------------------------------------------------


def parse_nccl_log(text: str, source: str = "", lines: bool = True) -> NcclLogReport:
    """What the log text proves (the channel lines kept unless lines=False)."""
    scan = scan_file(io.BytesIO(text.encode()), source or "(text)", keep_lines=lines)
    return build_report(scan, source, lines)


def read_nccl_log(path: str, lines: bool = False) -> NcclLogReport:
    """What the log at path proves, read as a stream; lines=True keeps every channel line."""
    try:
        with open(path, "rb") as handle:
            scan = scan_file(handle, path, keep_lines=lines)
    except OSError as error:
        raise UsageError(f"cannot read NCCL log {path}: {error.strerror}", fix=READ_FIX) from None
    return build_report(scan, path, lines)
