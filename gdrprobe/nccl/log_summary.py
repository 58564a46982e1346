"""From what an NCCL log's lines say (a :class:`gdrprobe.nccl.log.Scan`) to the report: the
verdict, the mechanism, what the log shows and what it cannot show.

Every sentence rests on a line that is there; a line that is missing is never evidence
(a log may be an excerpt, NCCL_DEBUG_SUBSYS may leave lines out, and what prints at INFO
changed across versions).
"""

from __future__ import annotations

from gdrprobe.nccl import log_diag, log_formats as formats
from gdrprobe.nccl.log_gin import gin_summary
from gdrprobe.nccl.rccl import PEERMEM_LABEL
from gdrprobe.report.nccl_log import (OTHER_NIC, OTHERS, ChannelUse, DmabufGpu, LogLine,
                                      NcclLogReport, NicUse, PairDecision)

# The variables that decide whether and how NCCL uses GPUDirect RDMA (param.cc and
# paths.cc print each one the job set).
GDR_ENV = ("NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_NET_GDR_C2C", "NCCL_DMABUF_ENABLE",
           "NCCL_IB_DISABLE", "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_IB_HCA", "NCCL_COLLNET_ENABLE")
FIRST_DMABUF_NCCL = (2, 13, 0)   # init.cc dmaBufSupported: NCCL registers through DMA-BUF from 2.13
TRACE_ONLY_PAIRS = (2, 30, 0)    # paths.cc ncclTopoCheckGdr: the per-pair line is TRACE from 2.30
MAX_PAIR_SENTENCES = 8
PEER_MEMORY = {"IB": "peer memory (nvidia-peermem)", "OFI": "peer memory (not DMA-BUF)"}
# What RCCL's own lines say (log_formats.RCCL_FORMATS), in words.
RCCL_NO_PEER_MEMORY = ("RCCL found no peer memory (GDRDMA not enabled: no memory_peers/amdkfd "
                       "file, no ib_register_peer_memory_client in /proc/kallsyms, or Hyper-V's "
                       "numa_balancing rule)")
RCCL_DMABUF_OFF = {
    "Dmabuf feature disabled without NCCL_DMABUF_ENABLE=1": "RCCL's DMA-BUF is off unless "
        "NCCL_DMABUF_ENABLE=1 (its default is 0)",
    "Current version of ROCm does not support dmabuf feature": "RCCL's DMA-BUF is off: HSA "
        "reports no DMA-BUF support (this ROCm or its driver)",
    "DMA_BUF_SUPPORT Failed due to OS kernel support": "RCCL's DMA-BUF is off: /boot/config-<kernel> "
        "lacks CONFIG_DMABUF_MOVE_NOTIFY=y or CONFIG_PCI_P2PDMA=y",
    "Failed to load ROCr missing symbol hsa_amd_portable_export_dmabuf": "RCCL's DMA-BUF is off: "
        "libhsa-runtime64 has no hsa_amd_portable_export_dmabuf",
}
WHY_DISABLED = {
    "no module": "no peer-memory module loaded (nv_peer_mem or nvidia-peermem)",
    "no module or not supported by GPU": "no peer-memory module, or the GPU does not support it",
    formats.NEITHER_PATH: "neither peer memory nor DMA-BUF usable",
}


# ---- per NIC ---------------------------------------------------------------------------------


def nic_mechanism(scan, host: str, space: str, tally) -> str | None:
    """How this NIC's GDRDMA connections registered GPU memory, where a line proves it."""
    if not tally.gdrdma:
        return None
    if host in scan.rccl and space == "IB":
        return rccl_mechanism(scan.rccl[host])
    peer_memory = PEER_MEMORY.get(space, PEER_MEMORY["OFI"])
    if "0" in scan.env.get("NCCL_DMABUF_ENABLE", {}):
        return peer_memory + ": NCCL_DMABUF_ENABLE=0 keeps NCCL off DMA-BUF (init.cc dmaBufSupported)"
    version = min(scan.versions, default=None)
    if version is not None and version < FIRST_DMABUF_NCCL:
        return peer_memory + f": NCCL {'.'.join(map(str, version))} predates DMA-BUF (2.13)"
    nic_offers = ("DMA-BUF" in tally.paths if space == "IB" else scan.ofi_dmabuf.get(host))
    if space == "OFI" and nic_offers is False:
        return peer_memory + ": the OFI plugin said it supports no DMA-BUF registration"
    if nic_offers and host in scan.dmabuf_hosts:
        # net.cc sendProxyConnect/recvProxyConnect: useDmaBuf = useGdr && the comm's DMA-BUF
        # support (the "DMA-BUF is available" line) && the NIC's NCCL_PTR_DMABUF.
        return "DMA-BUF: the plugin offered DMA-BUF on this NIC and NCCL found it on the GPU"
    return None


def rccl_mechanism(said) -> str | None:
    """How RCCL registered GPU memory where a connection used GDRDMA: with DMA-BUF off it can
    only have been peer memory; with peer memory missing, only DMA-BUF (net.cc useDmaBuf =
    useGdr && dmaBufSupport && the NIC's NCCL_PTR_DMABUF)."""
    if said.dmabuf_off:
        return f"{PEERMEM_LABEL}: {RCCL_DMABUF_OFF[said.dmabuf_off]}"
    if said.peer_memory == "" and said.dmabuf_on:
        return "DMA-BUF: " + RCCL_NO_PEER_MEMORY + ", and its DMA-BUF was on"
    return None


def rccl_reasons(scan, host: str, reasons: tuple[str, ...]) -> tuple[str, ...]:
    """Why a NIC RCCL logged Disabled had neither way, in RCCL's own words where it said them."""
    said = scan.rccl.get(host)
    if said is None or formats.NEITHER_PATH not in reasons:
        return reasons
    own = ((RCCL_NO_PEER_MEMORY,) if said.peer_memory == "" else ()) + (
        (RCCL_DMABUF_OFF[said.dmabuf_off],) if said.dmabuf_off else ())
    return tuple(reason for reason in reasons if reason != formats.NEITHER_PATH) + own if own else reasons


def capability(tally) -> bool | None:
    if tally.enabled and not tally.disabled:
        return True
    if tally.disabled and not tally.enabled:
        return False
    return None


def nic_uses(scan) -> tuple[NicUse, ...]:
    uses = []
    for (host, space, index), tally in sorted(scan.nics.items()):
        reasons = rccl_reasons(scan, host, tuple(tally.reasons))
        capable = capability(tally)
        if space == "OFI" and host in scan.ofi_gdr_off and not tally.enabled:
            # The OFI plugin turns GDR off for all of its NICs (nccl_ofi_ofiutils.c).
            reasons, capable = reasons + ("the OFI plugin: " + scan.ofi_gdr_off[host],), False
        uses.append(NicUse(
            host=host, transport=space, index=index,
            name=OTHERS if (host, space, index) == OTHER_NIC else tally.name, port=tally.port,
            link_layer=tally.link_layer, members=tally.members, net_plugins=tuple(sorted(tally.plugins)),
            gdr_capable=capable, gdr_disabled_because=reasons,
            gdr_paths=tuple(tally.paths), gdr_mechanism=nic_mechanism(scan, host, space, tally),
            gdrdma_channels=tally.gdrdma, host_memory_channels=tally.host_memory,
            unknown_channels=tally.unknown))
    return tuple(uses)


def nic_label(nic: NicUse, several_hosts: bool) -> str:
    name = nic.name or f"{nic.transport} NIC {nic.index}"
    return f"{name} on {nic.host}" if several_hosts and nic.host else name


# ---- the verdict and the mechanism -----------------------------------------------------------


def verdict(scan, nics: tuple[NicUse, ...], totals: tuple[int, int, int]) -> str:
    gdrdma, host_memory, unknown = totals
    if gdrdma + host_memory:
        if not gdrdma and all(nic.transport == "Socket" for nic in nics
                              if nic.gdrdma_channels + nic.host_memory_channels):
            return "socket"
        return "gdr-all" if not host_memory else "gdr-some" if gdrdma else "gdr-none"
    if unknown or scan.unrecognised:
        return "unknown"
    if gdr_off_everywhere(scan, nics):
        return "gdr-unavailable"
    return "no-net-channels"


def gdr_off_everywhere(scan, nics: tuple[NicUse, ...]) -> bool:
    """Whether every NIC NCCL judged (or every GPU-NIC pair it logged) had GDR off."""
    judged = [nic.gdr_capable for nic in nics if nic.transport != "Socket" and
              (nic.gdr_capable is not None or nic.gdr_disabled_because)]
    if judged:
        return all(capable is False for capable in judged)
    if scan.ofi_gdr_off or (scan.rccl and all(said.neither for said in scan.rccl.values())):
        return True
    pairs_on = scan.past.get("pairs on") or any(key[3] for key in scan.pairs)
    return bool(scan.pairs or scan.past.get("pairs off")) and not pairs_on


def mechanism(nics: tuple[NicUse, ...], outcome: str) -> str:
    used = [nic for nic in nics if nic.gdrdma_channels]
    if not used:
        return {"no-net-channels": "not shown: the log has no network channel lines",
                "gdr-unavailable": "none: GPUDirect RDMA was off on every NIC the log judges",
                "unknown": "not shown: no network channel line could be read"}.get(
                    outcome, "none: no network connection used GPUDirect RDMA")
    said = {nic.gdr_mechanism for nic in used}
    if len(said) == 1 and None not in said:
        return said.pop()
    if said == {None}:
        return ("not said: GPUDirect RDMA was used (/GDRDMA), but the log does not say whether "
                "through DMA-BUF or nvidia-peermem")
    several_hosts = len({nic.host for nic in nics}) > 1
    return "per NIC: " + "; ".join(
        f"{nic_label(nic, several_hosts)}: {(nic.gdr_mechanism or 'not said').split(':')[0]}"
        for nic in used)


# ---- what the log shows ----------------------------------------------------------------------


def channel_sentences(scan, nics: tuple[NicUse, ...], totals: tuple[int, int, int]) -> list[str]:
    gdrdma, host_memory, _ = totals
    said = []
    if gdrdma + host_memory:
        said.append(f"{gdrdma} of {gdrdma + host_memory} network channel connections used "
                    "GPUDirect RDMA (/GDRDMA)")
    socket = sum(nic.host_memory_channels for nic in nics if nic.transport == "Socket")
    if socket:
        said.append(f"{socket} connection(s) used NCCL's socket transport (NET/Socket): through "
                    "host memory, no GPUDirect RDMA")
    for host in scan.no_device:
        said.append(f"NCCL found no IB device{' on ' + host if host else ''} (NET/IB : No device found)")
    if scan.ring_gdr.get(0):
        said.append("NCCL's ring summary says GDR 0: a ring's network connection went without "
                    "GPUDirect RDMA (generic.cc, 2.24+)")
    return said


def nic_sentences(nics: tuple[NicUse, ...]) -> list[str]:
    several_hosts = len({nic.host for nic in nics}) > 1
    said = []
    for nic in nics:
        label = nic_label(nic, several_hosts)
        why = "; ".join(WHY_DISABLED.get(reason, reason) for reason in nic.gdr_disabled_because)
        if nic.gdr_capable is False and nic.gdrdma_channels:
            said.append(f"NIC {label}: NCCL logged GPUDirect RDMA Disabled for it, yet "
                        f"{nic.gdrdma_channels} connection(s) on it used GDRDMA: the log holds "
                        "processes or communicators that saw it differently")
        elif nic.gdr_capable is False and "DMA-BUF" in nic.gdr_paths and (
                formats.NEITHER_PATH in nic.gdr_disabled_because):
            # topo.cc: gdrSupport = NCCL_PTR_CUDA || (comm->dmaBufSupport && NCCL_PTR_DMABUF).
            said.append(f"GPUDirect RDMA unavailable on NIC {label}: its plugin offers DMA-BUF, yet "
                        "NCCL logged it Disabled, so NCCL's own DMA-BUF support was off "
                        "(init.cc dmaBufSupported: NCCL_DMABUF_ENABLE=0, a CUDA driver before 11.7, "
                        "or a GPU without DMA-BUF) and no peer-memory module served it")
        elif nic.gdr_capable is False:
            said.append(f"GPUDirect RDMA unavailable on NIC {label}: {why}")
        elif nic.gdr_capable is None and nic.gdr_disabled_because:
            said.append(f"NIC {label}: GPUDirect RDMA logged Enabled in some lines and Disabled "
                        f"in others ({why})")
        if nic.host_memory_channels and nic.transport != "Socket":
            said.append(f"NIC {label}: {nic.host_memory_channels} connection(s) through host memory")
    return said


def pair_sentences(pairs: tuple[PairDecision, ...]) -> list[str]:
    off = [pair for pair in pairs if not pair.enabled]
    said = [f"GDR off for GPU {pair.gpu} and NIC {pair.nic}{' on ' + pair.host if pair.host else ''}"
            f"{' (through PXN GPU ' + pair.pxn_via + ')' if pair.pxn_via else ''}: distance "
            f"{pair.comparison} (path type against NCCL_NET_GDR_LEVEL)" for pair in off[:MAX_PAIR_SENTENCES]]
    if len(off) > MAX_PAIR_SENTENCES:
        said.append(f"... and {len(off) - MAX_PAIR_SENTENCES} more GPU-NIC pairs with GDR off by distance")
    return said


def conclusions(scan, nics, totals, pairs, env) -> list[str]:
    said = channel_sentences(scan, nics, totals) + nic_sentences(nics) + pair_sentences(pairs)
    if scan.joined:
        said.append(f"{scan.joined} record(s) split across a line break (a terminal's wrap in a "
                    "paste) read whole: the line after each held nothing but its end")
    ofi_hosts = {nic.host for nic in nics if nic.transport == "OFI"}
    said += [f"the OFI plugin turned GPUDirect RDMA off{' on ' + host if host else ''}: {reason}"
             for host, reason in scan.ofi_gdr_off.items() if host not in ofi_hosts]
    if env:
        said.append("the job set " + ", ".join(env))
    if len(scan.versions) > 1:
        said.append("the log holds several NCCL versions: " + ", ".join(
            ".".join(map(str, version)) for version in scan.versions))
    if scan.flush:
        said.append("NCCL printed its flush of GDR receives (2.31+, net.cc recvSetup): " + ", ".join(
            f"{kind} on {count} connection(s)" for kind, count in sorted(scan.flush.items())))
    return said + rccl_sentences(scan) + log_diag.sentences(scan)


def rccl_sentences(scan) -> list[str]:
    said = []
    for host, facts in scan.rccl.items():
        where = f"{host}: " if host else ""
        if facts.peer_memory == "":
            said.append(where + RCCL_NO_PEER_MEMORY)
        elif facts.peer_memory:
            said.append(f"{where}RCCL found {PEERMEM_LABEL}: {facts.peer_memory}")
        if facts.dmabuf_off:
            said.append(where + RCCL_DMABUF_OFF[facts.dmabuf_off])
        elif facts.dmabuf_on:
            said.append(f"{where}RCCL's DMA-BUF was on (DMA_BUF Support Enabled: NCCL_DMABUF_ENABLE=1, "
                        "HSA's DMA-BUF support, the kernel's two options)")
    return said


# ---- what it cannot show ---------------------------------------------------------------------


def limits(scan, nics: tuple[NicUse, ...], outcome: str, totals: tuple[int, int, int]) -> list[str]:
    unknown = totals[2]
    unsaid = []
    if outcome in ("no-net-channels", "gdr-unavailable"):
        local = f" (only {scan.local_channels} inside a node)" if scan.local_channels else ""
        unsaid.append(f"no network channel lines{local}: the processes logged connected to no peer "
                      "across the network (a single-node job, or ranks whose ring and tree neighbours "
                      "were all on their node), or the log is an excerpt or NCCL_DEBUG_SUBSYS left out "
                      "INIT and NET; which connections used GDR cannot be told from it")
    if unknown:
        unsaid.append(f"{unknown} channel line(s) cut before their GDR suffix (\"/GDR\" is not "
                      "\"/GDRDMA\"): their GDR use is unknown and counted neither way")
    if scan.unrecognised:
        first_line, first_text = scan.examples[0]
        unsaid.append(f"{scan.unrecognised} network line(s) in a format not recognised (first at "
                      f"line {first_line}: {first_text!r}): a newer NCCL or a plugin this reader "
                      "does not know; they are counted nowhere")
    used = [nic for nic in nics if nic.gdrdma_channels]
    if used and any(nic.gdr_mechanism is None for nic in used):
        unsaid.append("the channel lines do not say whether GPU memory was registered through "
                      + ("DMA-BUF or amdkfd's peer memory; RCCL's 'Dmabuf feature disabled' or "
                         "'GDRDMA not enabled' line would" if scan.rccl or scan.rccl_version else
                         "DMA-BUF or nvidia-peermem; a plugin's 'GPU Direct RDMA (DMABUF) enabled for "
                         "HCA' line with 'DMA-BUF is available on GPU device', or NCCL_DMABUF_ENABLE=0, "
                         "would"))
    if scan.dmabuf_gpus and not used:
        unsaid.append("'DMA-BUF is available' describes the GPU only and prints even when GDR is "
                      "off for every NIC")
    version = min(scan.versions, default=None)
    if not scan.pairs and nics and (version is None or version >= TRACE_ONLY_PAIRS):
        unsaid.append("per GPU-NIC pair decisions (distance against NCCL_NET_GDR_LEVEL) print "
                      "only at TRACE from NCCL 2.30" + ("" if version else " (the log names no version)"))
    if any(nic.gdr_capable for nic in nics) and outcome in ("no-net-channels", "gdr-unavailable"):
        unsaid.append("'GPU Direct RDMA Enabled for HCA' is the NIC's capability; the distance "
                      "can still turn GDR off per GPU")
    return unsaid


# ---- the report ------------------------------------------------------------------------------


def channel_uses(scan, nics: tuple[NicUse, ...]) -> tuple[ChannelUse, ...]:
    names = {(nic.host, nic.transport, nic.index): nic.name for nic in nics}
    return tuple(ChannelUse(
        line=number, host=host, channel=channel, direction=direction, local=local, remote=remote,
        transport=transport, net_plugin=net, nic_index=nic,
        nic_name=names.get((host, formats.nic_space(transport), nic)), proxy_rank=proxy,
        gdrdma=gdrdma, pci_mapping=pci, shared=shared, collnet=collnet, flush=flush)
        for (number, host, channel, direction, local, remote, transport, net, nic, proxy, gdrdma,
             pci, shared, collnet, flush) in scan.channels)


def pair_decisions(scan) -> tuple[PairDecision, ...]:
    return tuple(PairDecision(host, gpu, nic, enabled, distance, level, comparison,
                              None if read is None else read == "1", mode, pxn, count)
                 for (host, gpu, nic, enabled, distance, level, comparison, read, mode, pxn), count
                 in scan.pairs.items())


def build_report(scan, source: str, lines: bool) -> NcclLogReport:
    nics = nic_uses(scan)
    totals = tuple(sum(getattr(nic, field) for nic in nics)
                   for field in ("gdrdma_channels", "host_memory_channels", "unknown_channels"))
    outcome = verdict(scan, nics, totals)
    pairs = pair_decisions(scan)
    env = tuple(f"{name}={value}" for name in GDR_ENV for value in scan.env.get(name, ()))
    version = next(iter(scan.versions), None)
    networks = sorted({*scan.networks, *(plugin for nic in nics for plugin in nic.net_plugins)})
    return NcclLogReport(
        source=source, library="RCCL" if scan.rccl or scan.rccl_version else "NCCL",
        nccl_version=".".join(map(str, version)) if version else None,
        verdict=outcome, mechanism=mechanism(nics, outcome), net_plugins=tuple(networks),
        hosts=scan.host_names(), nics=nics, network_channels=sum(totals),
        gdrdma_channels=totals[0], host_memory_channels=totals[1], unknown_channels=totals[2],
        local_channels=scan.local_channels, channels=channel_uses(scan, nics) if lines else (),
        pair_decisions=pairs,
        dmabuf_gpus=tuple(DmabufGpu(host, device) for host, device in scan.dmabuf_gpus),
        env=env, formats_read=tuple(f"{line_format.name} ({line_format.versions})"
                                    for line_format in formats.FORMATS
                                    if (line_format.name, line_format.versions) in scan.formats),
        unrecognised_lines=scan.unrecognised,
        unrecognised_examples=tuple(LogLine(*example) for example in scan.examples),
        cut_lines=scan.cut_lines, joined_records=scan.joined, summarised=tuple(scan.summarised),
        lines_read=scan.lines, conclusions=tuple(conclusions(scan, nics, totals, pairs, env)),
        cannot_conclude=tuple(limits(scan, nics, outcome, totals) + scan.reading_notes),
        gin=gin_summary(scan), diagnostics=log_diag.results(scan))
