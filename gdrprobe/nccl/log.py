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

The file is streamed, and whatever it holds the reader stays bounded: in time, linear in the
file (every pattern is, and a line over ``MAX_LINE_BYTES`` is read in pieces); in memory, by
the bounds below on what it remembers (hosts, NICs, GPU-NIC pairs, names; channel lines
only when asked for, and at most ``MAX_LISTED_CHANNELS``). Past a bound, records are counted
together under ``OTHERS`` and the report says so: the verdict and the channel counts stay
exact, only the breakdown per host or NIC is summarised.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import io
import re
from collections.abc import Callable

from gdrprobe.errors import UsageError
from gdrprobe.nccl import log_diag, log_gin, log_formats as formats
from gdrprobe.nccl.log_input import (BLOCK_BYTES, MAX_LINE_BYTES, NCCL_MARK, READ_FIX, block_reader,
                                     check_text, lines_of, log_name, open_log)
from gdrprobe.nccl.log_summary import GDR_ENV, build_report
from gdrprobe.report.nccl_log import OTHER_NIC, OTHERS, NcclLogReport

EXAMPLES = 3                 # unrecognised lines quoted in the report
EXAMPLE_CHARS = 200

# What one log may make the reader remember, whatever it holds. Real logs stay far below:
# NCCL names a host by its name up to the first dot (debug.cc getHostNameForLog) and has at
# most 256 NICs a process (net_ib/common.h MAX_IB_VDEVS), 16 network plugins
# (nccl_net.h NCCL_NET_MAX_PLUGINS) and 8 devices in a merged NIC
# (NCCL_NET_MAX_DEVS_PER_NIC). docs/doctor.md gives the peak memory they allow, measured.
NAME_CHARS = 255             # a host, NIC, GPU or network name is cut to this (DNS: 255 octets)
MAX_HOSTS = 2048             # hosts named one by one; the records of the rest, under OTHERS
MAX_NICS = 8192              # NICs (host, network, index) tallied one by one
MAX_PAIRS = 8192             # distinct GPU-NIC pair decisions listed
MAX_GPUS = 8192              # GPUs with DMA-BUF listed
MAX_NAMES = 8192             # distinct NIC names and GPU and NIC ids
MAX_FEW = 16                 # NCCL versions, network names, values of one variable
MAX_VALUES = MAX_FEW * len(GDR_ENV)   # values of the variables read, and the plugins' reasons
MAX_MEMBERS = 8              # devices of a merged NIC
MAX_LISTED_CHANNELS = 10_000    # channel lines kept for --lines; the rest are counted
# A channel's ends as listed, "rank[device]": a rank (int) and a bus id or device number
# (net.cc: "%d[%d]", "%d[%lx]") take 28 characters at most.
END_CHARS = 32
MAX_FAST_KEYS = 4096         # distinct fast lines counted before they are folded in
FAST_LINE_BYTES = 1024       # longer lines go record by record, where every name is cut


class Remembered:
    """Distinct names up to ``limit``, each cut to NAME_CHARS and kept once (every record
    that names it shares that one string); past the limit a new name reads as OTHERS and
    is counted in ``past``."""

    __slots__ = ("limit", "known", "past", "keep_end")

    def __init__(self, limit: int, keep_end: bool = False):
        self.limit, self.keep_end = limit, keep_end
        self.known: dict[str, str] = {}
        self.past = 0

    def cut(self, name: str) -> str:
        if len(name) <= NAME_CHARS:
            return name
        return name[-NAME_CHARS:] if self.keep_end else name[:NAME_CHARS]

    def __call__(self, name: str) -> str:
        name = self.cut(name)
        known = self.known.get(name)
        if known is None:
            if len(self.known) >= self.limit:
                self.past += 1
                return OTHERS
            known = self.known[name] = name
        return known


class NicTally:
    """What the log says about one NIC of one host."""

    __slots__ = ("name", "port", "link_layer", "members", "plugins", "enabled", "disabled",
                 "reasons", "paths", "gdrdma", "host_memory", "unknown")

    def __init__(self) -> None:
        self.name = self.port = self.link_layer = None
        self.members: tuple[str, ...] = ()
        self.plugins: dict[str, None] = {}           # network names: at most MAX_FEW + OTHERS
        self.enabled = self.disabled = 0             # "GPU Direct RDMA Enabled/Disabled for HCA"
        self.reasons: dict[str, None] = {}
        self.paths: dict[str, None] = {}             # what a plugin offers: DMA-BUF, nvidia-peermem
        self.gdrdma = self.host_memory = self.unknown = 0


class RcclTally:
    """What RCCL said at init on one host about its two ways to register GPU memory
    (log_formats.RCCL_FORMATS): peer memory, what found it ("" where it said it found none);
    DMA-BUF, why off, or on."""

    __slots__ = ("peer_memory", "dmabuf_off", "dmabuf_on")

    def __init__(self) -> None:
        self.peer_memory: str | None = None
        self.dmabuf_off: str | None = None
        self.dmabuf_on = False

    @property
    def neither(self) -> bool:
        """Whether RCCL said both ways are off: then no NIC of this host may carry GDR
        (topo.cc gdrSupport = NCCL_PTR_CUDA || (dmaBufSupport && NCCL_PTR_DMABUF))."""
        return self.peer_memory == "" and self.dmabuf_off is not None


@dataclasses.dataclass
class Scan:
    """What the lines say, gathered in one pass; bounded by the limits above, not by the
    length of the log or the number of hosts, NICs and channels it names."""

    keep_lines: bool = False
    versions: dict = dataclasses.field(default_factory=dict)        # (major, minor, patch)
    hosts: Remembered = dataclasses.field(default_factory=lambda: Remembered(MAX_HOSTS, keep_end=True))
    host_lengths: list = dataclasses.field(default_factory=list)    # of the hosts known, ascending
    names: Remembered = dataclasses.field(default_factory=lambda: Remembered(MAX_NAMES))
    nets: Remembered = dataclasses.field(default_factory=lambda: Remembered(MAX_FEW))
    values: Remembered = dataclasses.field(default_factory=lambda: Remembered(MAX_VALUES))
    nics: dict = dataclasses.field(default_factory=dict)            # (host, space, index) -> NicTally
    channels: list = dataclasses.field(default_factory=list)        # kept lines: see read_channel
    local_channels: int = 0
    pairs: dict = dataclasses.field(default_factory=dict)           # decision key -> count
    dmabuf_gpus: dict = dataclasses.field(default_factory=dict)     # (host, device)
    dmabuf_hosts: dict = dataclasses.field(default_factory=dict)    # hosts with such a GPU
    env: dict = dataclasses.field(default_factory=dict)             # name -> {value}
    networks: dict = dataclasses.field(default_factory=dict)        # "Using network X"
    no_device: dict = dataclasses.field(default_factory=dict)       # host -> None
    ofi_gdr_off: dict = dataclasses.field(default_factory=dict)     # host -> reason
    ofi_dmabuf: dict = dataclasses.field(default_factory=dict)      # host -> bool
    ring_gdr: dict = dataclasses.field(default_factory=dict)        # GDR 0/1 -> count
    flush: dict = dataclasses.field(default_factory=dict)           # 2.31 "/flush=X" -> count
    diag: dict = dataclasses.field(default_factory=dict)            # NCCL DIAG results: log_diag
    rccl: dict = dataclasses.field(default_factory=dict)            # host -> RcclTally
    rccl_version: bool = False                                      # an "RCCL version" line
    gin: dict = dataclasses.field(default_factory=dict)             # host -> log_gin.GinTally
    formats: dict = dataclasses.field(default_factory=dict)         # (name, versions) -> count
    fast: dict = dataclasses.field(default_factory=dict)            # fast lines' groups -> count
    unrecognised: int = 0
    examples: list = dataclasses.field(default_factory=list)        # (line, text)
    cut_lines: int = 0
    joined: int = 0              # records split across a line break, joined again
    past: dict = dataclasses.field(default_factory=dict)            # what -> records past its bound
    lines: int = 0
    saw_nccl: bool = False

    def nic(self, host: str, space: str, index: int) -> NicTally:
        key = (host, space, index)
        tally = self.nics.get(key)
        if tally is None:
            if len(self.nics) >= MAX_NICS and key != OTHER_NIC:
                self.count_past("nics")
                return self.nic(*OTHER_NIC)
            tally = self.nics[key] = NicTally()
        return tally

    def count_past(self, what: str) -> None:
        self.past[what] = self.past.get(what, 0) + 1

    def host_names(self) -> tuple[str, ...]:
        return tuple(self.hosts.known) + ((OTHERS,) if self.hosts.past else ())

    @property
    def summarised(self) -> list[str]:
        """What the bounds summarised: past them, records are counted together."""
        past = dict(self.past)
        past["pairs"] = past.pop("pairs on", 0) + past.pop("pairs off", 0)
        for what in ("hosts", "names", "nets", "values"):
            past[what] = getattr(self, what).past
        said = past_bound()
        return [said[what].format(n=count) for what, count in past.items() if count]

    @property
    def reading_notes(self) -> list[str]:
        """What the report cannot show because of how the file was read."""
        cut = [] if not self.cut_lines else [
            f"{self.cut_lines} line(s) cut: without a line end (cut when the log was copied), or "
            f"longer than {MAX_LINE_BYTES >> 10} KiB (read in pieces of that size): what they say "
            "is read only where it is whole"]
        return cut + self.summarised


def past_bound() -> dict[str, str]:
    """What each bound summarised, as the report says it ({n}: how many records)."""
    return {
        "hosts": f"the log names more than {MAX_HOSTS} hosts: the records of hosts past the first "
                 f"{MAX_HOSTS} are counted together under host '{OTHERS}'",
        "nics": f"the log names more than {MAX_NICS} NICs (by host, network and index): the records of "
                f"NICs past the first {MAX_NICS} are counted together as NIC '{OTHERS}'",
        "names": f"NIC, GPU and device names past the first {MAX_NAMES} distinct ones read as '{OTHERS}'",
        "nets": f"network names past the first {MAX_FEW} distinct ones read as '{OTHERS}'",
        "values": f"variable values and plugin reasons past the first {MAX_VALUES} distinct ones read as "
                  f"'{OTHERS}'",
        "pairs": f"{{n}} GPU-NIC pair decision line(s) past the first {MAX_PAIRS} distinct decisions are "
                 "counted (on or off), not listed",
        "gpus": f"{{n}} line(s) naming GPUs with DMA-BUF past the first {MAX_GPUS} are not listed",
        "versions": f"{{n}} NCCL version line(s) naming versions past the first {MAX_FEW} are not listed",
        "channels": f"{{n}} network channel line(s) past the first {MAX_LISTED_CHANNELS} are counted, not "
                    "listed",
        "diagnostics": f"{{n}} NCCL DIAG result line(s) past the first {log_diag.MAX_RESULTS} distinct ones "
                       "are not listed",
    }


# ---- reading the file ----------------------------------------------------------------------


# A line whose last record may be a channel line a terminal wrapped (see formats.continued).
CHANNEL_RECORD = re.compile(rb"NCCL INFO (?:Channel|Ring|Coll)")


def scan_file(read: Callable[[], bytes], path: str, keep_lines: bool) -> Scan:
    """Every line read() gives, each once the next has been seen: a line that can only be
    the end of the record before it is read as part of that record."""
    head = read()
    check_text(head, path)
    scan = Scan(keep_lines=keep_lines)
    held = None
    for line in lines_of(read, head, scan):
        if held is not None:
            if join_split_record(scan, held, line):
                held = None
                continue
            read_raw(scan, *held)
        held = line
    if held is not None:
        read_raw(scan, *held)
    fold_fast_lines(scan)
    if not scan.saw_nccl:
        raise UsageError(f"no NCCL line in {path}: no 'NCCL INFO' record and no 'NCCL version' line",
                         fix="run the job with NCCL_DEBUG=INFO and " + READ_FIX)
    return scan


def read_raw(scan: Scan, number: int, raw: bytes, whole: bool) -> None:
    """One line (or piece): most lines of a large log in one match, counted by their
    fields and folded onto their NICs later; any other, record by record."""
    if (whole and not scan.keep_lines and len(raw) <= FAST_LINE_BYTES
            and (match := formats.FAST_LINE.fullmatch(raw))):
        if match.group(6):
            scan.local_channels += 1
            return
        key = match.groups()
        if key not in scan.fast:
            if len(scan.fast) >= MAX_FAST_KEYS:
                fold_fast_lines(scan)
            scan.fast[key] = 0
            scan_host(scan, key[0].decode("utf-8", "replace"), glued=False)
        scan.fast[key] += 1
    elif formats.KEYWORDS.search(raw):
        read_records(scan, number, formats.records(text_of(raw)), whole)


def text_of(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r")


def join_split_record(scan: Scan, held: tuple[int, bytes, bool], line: tuple[int, bytes, bool]) -> bool:
    """Read the held line's last record joined with the next line, when that line holds no
    NCCL record and can only be its end (formats.continued); whether it did."""
    number, held_raw, held_ended = held
    raw = line[1]
    if (not held_ended or b"NCCL INFO " in raw or NCCL_MARK.search(raw) is not None
            or CHANNEL_RECORD.search(held_raw) is None):
        return False
    found = formats.records(text_of(held_raw))
    if not found:
        return False
    joined = formats.continued(found[-1].message, text_of(raw))
    if joined is None:
        return False
    scan.joined += 1
    read_records(scan, number, found[:-1] + [found[-1]._replace(message=joined)], line[2])
    return True


def fold_fast_lines(scan: Scan) -> None:
    """Count the lines read in one match (formats.FAST_LINE), tallied by their fields, as
    their readers count the others."""
    for groups, count in scan.fast.items():
        host, net, nic, gdrdma, flush, _, gdr_net, state, index, name = (
            None if group is None else group.decode("utf-8", "replace") for group in groups)
        host = scan_host(scan, host, glued=False)
        line_format = formats.CHANNEL_FORMATS[0] if net else formats.NIC_GDR_FORMAT
        key = (line_format.name, line_format.versions)
        scan.formats[key] = scan.formats.get(key, 0) + count
        if net:
            count_channel(scan, host, net, int(nic), bool(gdrdma), count, flush=flush)
        else:
            count_nic_gdr(scan, host, gdr_net, int(index), name, state == "Enabled", None, count)
    scan.fast.clear()


# ---- reading one line ----------------------------------------------------------------------


def read_records(scan: Scan, number: int, found: list[formats.Record], whole: bool) -> None:
    for position, (host, message, glued) in enumerate(found):
        last = position == len(found) - 1
        # A record ends cut where the line does, or where the next one is glued on without
        # a space (something wrote over its end).
        cut = not whole if last else found[position + 1].glued
        read_message(scan, number, scan_host(scan, host, glued), message, cut)


def scan_host(scan: Scan, host: str, glued: bool) -> str:
    """The host a record came from, as remembered (past MAX_HOSTS: OTHERS). A record glued
    to the one before without a space may carry the end of that message in its host
    ("GDRDMAnode2"): the longest known host it ends with is taken instead."""
    if not host:
        return host
    host = scan.hosts.cut(host)
    known = scan.hosts.known.get(host)
    if known is not None:
        return known
    if glued:
        # One look-up per length a known host has (at most NAME_CHARS), the longest first.
        for length in reversed(scan.host_lengths):
            if length < len(host) and (known := scan.hosts.known.get(host[-length:])):
                return known
    remembered = scan.hosts(host)
    if remembered is not OTHERS and len(host) not in scan.host_lengths:
        bisect.insort(scan.host_lengths, len(host))
    return remembered


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
                              collnet, match.groupdict().get("flush"))
    if scan.keep_lines:
        keep_channel(scan, number, host, match.groupdict(), gdrdma, collnet, transport)


def keep_channel(scan: Scan, number: int, host: str, fields: dict, gdrdma: bool | None,
                 collnet: bool, transport: str) -> None:
    """A channel line for --lines, as the few fields the report shows (names cut like
    every name), up to MAX_LISTED_CHANNELS; the rest are counted, not listed."""
    if len(scan.channels) >= MAX_LISTED_CHANNELS:
        scan.count_past("channels")
        return
    device, peer_device = fields.get("dev"), fields.get("pdev")
    scan.channels.append((
        number, host, int(fields["channel"]), fields["dir"],
        (fields["rank"] + (f"[{device}]" if device else ""))[:END_CHARS],
        "" if collnet else (fields["peer"] + (f"[{peer_device}]" if peer_device else ""))[:END_CHARS],
        transport, scan.nets(fields["net"]), int(fields["nic"]),
        int(fields["proxy"]) if fields.get("proxy") else None, gdrdma,
        bool(fields["pci"]), bool(fields["shared"]), collnet, fields.get("flush")))


def count_channel(scan: Scan, host: str, net: str, nic: int, gdrdma: bool | None, count: int,
                  collnet: bool = False, flush: str | None = None) -> str:
    """Count channel lines on their NIC (and 2.31's flush of a GDR receive: flush); returns
    their transport, normalised (a name transport_of knows, or the network's name as
    remembered)."""
    if flush:
        scan.flush[flush] = scan.flush.get(flush, 0) + count
    net = scan.nets(net)
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
        tally.name, tally.port = scan.names(name), port
        tally.link_layer = layer if layer is None else scan.names(layer)
        tally.members = tuple(scan.names(member) for member in members[:MAX_MEMBERS])


def read_virtual_nic(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    tally = scan.nic(host, "IB", int(match.group("index")))
    tally.name = scan.names(match.group("name"))
    if int(match.group("ndevs")) > 1:
        tally.members = tuple(scan.names(member)
                              for member in match.group("name").split("+")[:MAX_MEMBERS])


def read_nic_gdr(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    count_nic_gdr(scan, host, match.group("net"), int(match.group("index")), match.group("name"),
                  match.group("state") == "Enabled", match.groupdict().get("reason"), 1)


def count_nic_gdr(scan: Scan, host: str, net: str, index: int, name: str, enabled: bool,
                  reason: str | None, count: int) -> None:
    net = scan.nets(net)
    tally = scan.nic(host, formats.nic_space(formats.transport_of(net)), index)
    tally.name = scan.names(name)
    tally.plugins[net] = None
    if enabled:
        tally.enabled += count
    else:
        tally.disabled += count
        tally.reasons[reason or formats.NEITHER_PATH] = None


def read_nic_path(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    tally = scan.nic(host, "IB", int(match.group("index")))
    tally.name = tally.name or scan.names(match.group("name"))
    tally.paths["DMA-BUF" if match.group("path") == "DMABUF" else "nvidia-peermem"] = None


def read_pair(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    fields = match.groupdict()
    enabled = fields["state"] == "Enabled"
    names = scan.names
    key = (host, names(fields["gpu"]), names(fields["nic"]), enabled, int(fields["distance"]),
           int(fields["level"]), f"{fields['distance']} {fields['op']} {fields['level']}",
           fields.get("read"), fields.get("mode") and names(fields["mode"]),
           fields.get("pxn") and names(fields["pxn"]))
    if key not in scan.pairs and len(scan.pairs) >= MAX_PAIRS:
        scan.count_past("pairs on" if enabled else "pairs off")
        return
    scan.pairs[key] = scan.pairs.get(key, 0) + 1


def read_version(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    version = tuple(int(part) for part in match.group("major", "minor", "patch"))
    if version in scan.versions or len(scan.versions) < MAX_FEW:
        scan.versions[version] = None
    else:
        scan.count_past("versions")


def read_rccl_version(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.rccl_version = True
    read_version(scan, number, host, match, cut)


def rccl_tally(scan: Scan, host: str) -> RcclTally:
    """Keyed by host as remembered: at most MAX_HOSTS and OTHERS."""
    return scan.rccl.setdefault(host, RcclTally())


def read_rccl_peer_memory(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    """"GDRDMA not enabled" follows a "Found" line where Hyper-V's rule turned peer memory off
    after all, and RCCL_FORCE_ENABLE_GDRDMA=1 skips every check: those two decide."""
    tally = rccl_tally(scan, host)
    if match.group("forced"):
        tally.peer_memory = f"{match.group('forced')}=1"
    elif match.group("missing"):
        if not (tally.peer_memory or "").startswith("RCCL"):
            tally.peer_memory = ""
    elif tally.peer_memory is None:
        found = match.group("found")
        tally.peer_memory = found if found.startswith("/") else f"{found} in /proc/kallsyms"


def read_rccl_dmabuf(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    tally = rccl_tally(scan, host)
    if match.group("on"):
        tally.dmabuf_on = True
    else:
        tally.dmabuf_off = tally.dmabuf_off or match.group("off")


def read_env(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    if match.group("name") in GDR_ENV:
        values = scan.env.setdefault(match.group("name"), {})
        value = scan.values(match.group("value").rstrip("."))
        if value in values or len(values) < MAX_FEW:
            values[value] = None


def read_network(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.networks[scan.nets(match.group("net"))] = None


def read_no_device(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.no_device[host] = None


def read_gpu_dmabuf(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    scan.dmabuf_hosts[host] = None
    key = (host, int(match.group("device")))
    if key in scan.dmabuf_gpus or len(scan.dmabuf_gpus) < MAX_GPUS:
        scan.dmabuf_gpus[key] = None
    else:
        scan.count_past("gpus")


def read_ofi(scan: Scan, number: int, host: str, match, cut: bool) -> None:
    if "reason" in match.groupdict():
        scan.ofi_gdr_off[host] = scan.values(match.group("reason"))
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
    "ofi-dmabuf": read_ofi, "ring-summary": read_ring_summary, "rccl-version": read_rccl_version,
    "rccl-peer-memory": read_rccl_peer_memory, "rccl-dmabuf": read_rccl_dmabuf,
    **log_gin.READERS,
    "diag": log_diag.read_diag,
}


# ---- the public entry points ---------------------------------------------------------------


def parse_nccl_log(text: str, source: str = "", lines: bool = True) -> NcclLogReport:
    """What the log text proves (the channel lines kept unless lines=False)."""
    stream = io.BytesIO(text.encode())
    scan = scan_file(functools.partial(stream.read, BLOCK_BYTES), source or "(text)",
                     keep_lines=lines)
    return build_report(scan, source, lines)


def read_nccl_log(path: str, lines: bool = False) -> NcclLogReport:
    """What the log at path ("-": standard input) proves, read as a stream; lines=True keeps
    every channel line (up to MAX_LISTED_CHANNELS)."""
    try:
        with open_log(path) as handle:
            scan = scan_file(block_reader(handle), log_name(path), keep_lines=lines)
    except OSError as error:
        raise UsageError(f"cannot read NCCL log {log_name(path)}: {error.strerror}",
                         fix=READ_FIX) from None
    return build_report(scan, path, lines)
