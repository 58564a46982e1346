"""`gdrprobe nccl-log` on logs in the formats of NCCL 2.4 to 2.31 and its network plugins.

The fixtures under fixtures/nccl_logs/ were written line by line from the format strings in
NCCL's source (net.cc, coll_net.cc, net_ib.cc, paths.cc, topo.cc, init.cc, debug.cc at the
tag each file names), nccl-rdma-sharp-plugins' p2p_plugin.c and sharp_plugin.c, and
aws-ofi-nccl's nccl_ofi_*.c; hosts, ranks and NIC names are made up.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import threading
import time

import pytest

from gdrprobe.cli import nccl_log as command
from gdrprobe.errors import ExitCode, UsageError
from gdrprobe.nccl import log_formats
from gdrprobe.nccl.log import parse_nccl_log, read_nccl_log
from gdrprobe.report.model import to_json
from gdrprobe.report.text import render_nccl_log

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "nccl_logs"


def fixture(name: str, lines: bool = True):
    return read_nccl_log(str(FIXTURES / name), lines=lines)


def nic_table(report):
    return [(nic.host, nic.transport, nic.index, nic.name, nic.gdr_capable, nic.gdrdma_channels,
             nic.host_memory_channels, nic.unknown_channels) for nic in report.nics]


# (fixture, NCCL version, verdict, exit code): every fixture, read whole.
EXPECTED = [
    ("nccl-2.4.8-ring.log", "2.4.8", "gdr-some", ExitCode.OK),
    ("nccl-2.4.8-no-module.log", "2.4.8", "gdr-none", ExitCode.VERDICT_NOT_OK),
    ("nccl-2.5.7-ring-busid.log", "2.5.7", "gdr-some", ExitCode.OK),
    ("nccl-2.7.8-channel.log", "2.7.8", "gdr-some", ExitCode.OK),
    ("nccl-2.8.4-shared.log", "2.8.4", "gdr-all", ExitCode.OK),
    ("nccl-2.12.12-pxn.log", "2.12.12", "gdr-all", ExitCode.OK),
    ("nccl-2.18.5-nvml.log", "2.18.5", "gdr-some", ExitCode.OK),
    ("nccl-2.21.5-merged.log", "2.21.5", "gdr-all", ExitCode.OK),
    ("nccl-2.24.3-virtual.log", "2.24.3", "gdr-all", ExitCode.OK),
    ("nccl-2.31.2-flush-diag.log", "2.31.2", "gdr-all", ExitCode.OK),
    ("nccl-2.26.6-c2c.log", "2.26.6", "gdr-all", ExitCode.OK),
    ("nccl-2.29.7-topo-ids.log", "2.29.7", "gdr-some", ExitCode.OK),
    ("nccl-2.30.7-trace.log", "2.30.7", "gdr-all", ExitCode.OK),
    ("ibext-2020-nccl-2.7.8.log", "2.7.8", "gdr-some", ExitCode.OK),
    ("ibext_v8-nccl-2.19.4.log", "2.19.4", "gdr-all", ExitCode.OK),
    ("ibext_v10-nccl-2.23.4.log", "2.23.4", "gdr-some", ExitCode.OK),
    ("rdma-plugin-v10-nccl-2.26.6.log", "2.26.6", "gdr-none", ExitCode.VERDICT_NOT_OK),
    ("sharp-nccl-2.18.5.log", "2.18.5", "gdr-all", ExitCode.OK),
    ("aws-ofi-libfabric-nccl-2.18.5.log", "2.18.5", "gdr-all", ExitCode.OK),
    ("aws-ofi-gdr-off-nccl-2.12.12.log", "2.12.12", "gdr-none", ExitCode.VERDICT_NOT_OK),
    ("aws-ofi-gdr-required-nccl-2.18.5.log", "2.18.5", "gdr-unavailable", ExitCode.VERDICT_NOT_OK),
    ("socket-nccl-2.21.5.log", "2.21.5", "socket", ExitCode.VERDICT_NOT_OK),
    ("socket-no-ib-device-nccl-2.18.5.log", "2.18.5", "socket", ExitCode.VERDICT_NOT_OK),
    ("gdr-off-every-nic-nccl-2.18.5.log", "2.18.5", "gdr-unavailable", ExitCode.VERDICT_NOT_OK),
    ("wrapped-paste-nccl-2.11.4.log", "2.11.4", "gdr-all", ExitCode.OK),
    ("single-node-nccl-2.21.5.log", "2.21.5", "no-net-channels", ExitCode.OK),
    ("messy-paste-nccl-2.21.5.log", "2.21.5", "gdr-some", ExitCode.OK),
    ("unrecognised-format.log", "2.31.0", "unknown", ExitCode.NOT_TESTABLE),
    ("rccl-2.21.5-peermem-amdkfd.log", "2.21.5", "gdr-all", ExitCode.OK),
    ("rccl-2.21.5-gdrdma-not-enabled.log", "2.21.5", "gdr-none", ExitCode.VERDICT_NOT_OK),
    ("rccl-2.21.5-dmabuf.log", "2.21.5", "gdr-all", ExitCode.OK),
    ("rccl-2.21.5-kernel-config.log", "2.21.5", "gdr-unavailable", ExitCode.VERDICT_NOT_OK),
    ("gin-gdaki-cpu-proxy-nccl-2.30.7.log", "2.30.7", "gdr-all", ExitCode.OK),
    ("gin-gdaki-nccl-2.29.7.log", "2.29.7", "gdr-all", ExitCode.OK),
    ("gin-disabled-nccl-2.29.7.log", "2.29.7", "gdr-all", ExitCode.OK),
    ("gin-unavailable-nccl-2.30.7.log", "2.30.7", "gdr-none", ExitCode.VERDICT_NOT_OK),
    ("gin-proxy-nccl-2.28.7.log", "2.28.7", "gdr-all", ExitCode.OK),
    ("gin-efa-gda-aws-ofi-nccl-2.31.2.log", "2.31.2", "gdr-all", ExitCode.OK),
]


@pytest.mark.parametrize("name, version, verdict, exit_code", EXPECTED, ids=[row[0] for row in EXPECTED])
def test_every_fixture_reads_to_its_verdict(name, version, verdict, exit_code):
    report = fixture(name)
    assert (report.nccl_version, report.verdict, report.exit_code) == (version, verdict, exit_code)


def test_every_fixture_is_in_the_table():
    assert sorted(path.name for path in FIXTURES.glob("*.log")) == sorted(row[0] for row in EXPECTED)


def test_every_line_format_has_a_fixture_in_it():
    read = {text for row in EXPECTED for text in fixture(row[0]).formats_read}
    written = {f"{line_format.name} ({line_format.versions})" for line_format in log_formats.FORMATS}
    assert written - read == set()


# ---- item 8: older NCCL ------------------------------------------------------------------


def test_nccl_2_4_ring_lines_are_network_channels_not_a_single_node():
    report = fixture("nccl-2.4.8-ring.log")
    assert report.network_channels == 4 and report.local_channels == 1
    assert nic_table(report) == [("nodea", "IB", 0, "mlx5_0", None, 2, 0, 0),
                                 ("nodea", "IB", 1, "mlx5_1", None, 0, 2, 0)]
    assert [(channel.channel, channel.local, channel.remote, channel.direction)
            for channel in report.channels[:2]] == [(0, "1", "2", "send"), (0, "3", "0", "receive")]
    assert not any("single-node" in text for text in report.cannot_conclude)


def test_nccl_2_4_per_gpu_lines():
    on, off = fixture("nccl-2.4.8-ring.log").pair_decisions
    assert (on.gpu, on.nic, on.enabled, on.read) == ("0[0]", "0", True, False)
    assert (off.gpu, off.enabled, off.comparison) == ("1[1]", False, "4 >= 4")
    no_module = fixture("nccl-2.4.8-no-module.log")
    assert no_module.nics[0].gdr_capable is False
    assert no_module.nics[0].gdr_disabled_because == ("no module or not supported by GPU",)


def test_nccl_2_5_ring_lines_with_bus_ids():
    report = fixture("nccl-2.5.7-ring-busid.log")
    assert [(channel.local, channel.remote, channel.nic_name, channel.gdrdma) for channel in report.channels] == [
        ("1[3d000]", "2[1b000]", "mlx5_0", True), ("1[3d000]", "2[1b000]", "mlx5_1", False)]
    assert report.nics[1].gdr_disabled_because == ("no module",)
    assert any("distance 4 >= 4" in text for text in report.conclusions)


# ---- item 9: network plugins -------------------------------------------------------------


@pytest.mark.parametrize("name, plugin", [
    ("ibext-2020-nccl-2.7.8.log", "IBext"), ("ibext_v8-nccl-2.19.4.log", "IBext_v8"),
    ("ibext_v10-nccl-2.23.4.log", "IBext_v10"), ("rdma-plugin-v10-nccl-2.26.6.log", "NCCL RDMA Plugin v10"),
    ("sharp-nccl-2.18.5.log", "IBext_v7")])
def test_ib_plugins_count_on_their_nics_with_the_transport_normalised(name, plugin):
    report = fixture(name)
    network = [channel for channel in report.channels if not channel.collnet]
    assert {(channel.transport, channel.net_plugin) for channel in network} == {("IB", plugin)}
    assert all(channel.nic_name for channel in report.channels)
    assert plugin in report.net_plugins
    assert sum(nic.gdrdma_channels + nic.host_memory_channels for nic in report.nics) == len(report.channels)


def test_the_plugin_gdr_disabled_line_is_read():
    report = fixture("ibext-2020-nccl-2.7.8.log")
    assert nic_table(report) == [("nodea", "IB", 0, "mlx5_0", None, 2, 0, 0),
                                 ("nodea", "IB", 1, "mlx5_1", False, 0, 1, 0)]
    assert any("mlx5_1: no peer-memory module loaded" in text for text in report.conclusions)


def test_sharp_collnet_counts_on_the_ib_nic_it_runs_on():
    report = fixture("sharp-nccl-2.18.5.log")
    collnet = [channel for channel in report.channels if channel.collnet]
    assert {(channel.transport, channel.nic_name, channel.remote) for channel in collnet} == {("SHARP", "mlx5_1", "")}
    assert nic_table(report)[1] == ("nodea", "IB", 1, "mlx5_1", True, 2, 0, 0)


def test_aws_ofi_plugin():
    report = fixture("aws-ofi-libfabric-nccl-2.18.5.log")
    assert {channel.transport for channel in report.channels} == {"OFI"}
    assert [nic.name for nic in report.nics] == ["rdmap16s27", "rdmap32s27"]
    # The plugin said it registers no DMA-BUF: its GDR went through peer memory.
    assert report.mechanism.startswith("peer memory")


def test_aws_ofi_plugin_turning_gdr_off():
    report = fixture("aws-ofi-gdr-off-nccl-2.12.12.log")
    assert [(channel.transport, channel.net_plugin) for channel in report.channels] == [("OFI", "AWS Libfabric")] * 2
    nic, = report.nics
    assert (nic.gdr_capable, nic.host_memory_channels) == (False, 2)
    assert any("OFI plugin" in text and "disabling GDR" in text for text in report.conclusions)


# ---- item 10: merged NICs ----------------------------------------------------------------


def test_merged_nics_in_the_using_list_of_2_20_to_2_23():
    report = fixture("nccl-2.21.5-merged.log")
    assert [(nic.index, nic.name, nic.members, nic.link_layer) for nic in report.nics] == [
        (0, "mlx5_0+mlx5_1", ("mlx5_0", "mlx5_1"), "RoCE"), (1, "mlx5_2", (), "RoCE")]
    # The second entry prints its physical index [2]; NCCL's NIC 1 is the second entry.
    assert [channel.nic_name for channel in report.channels] == ["mlx5_0+mlx5_1", "mlx5_2"]
    assert not any("={" in (nic.name or "") for nic in report.nics)


def test_virtual_nics_of_2_24_and_later():
    report = fixture("nccl-2.24.3-virtual.log")
    merged = report.nics[2]
    assert (merged.name, merged.members, merged.gdrdma_channels) == ("mlx5_0+mlx5_1", ("mlx5_0", "mlx5_1"), 2)


def test_rails_and_planes_of_2_30():
    report = fixture("nccl-2.30.7-trace.log")
    assert [(nic.name, nic.port, nic.link_layer) for nic in report.nics] == [("mlx5_0", 1, "IB"), ("mlx5_1", 1, "IB")]
    off, = report.pair_decisions      # a TRACE line is read when the log has one
    assert (off.gpu, off.nic, off.enabled) == ("0-0", "0-1", False)


# ---- item 11: messy pastes ---------------------------------------------------------------


def test_glued_records_launcher_prefixes_and_a_cut_last_line():
    report = fixture("messy-paste-nccl-2.21.5.log")
    assert [(channel.line, channel.host, channel.nic_name, channel.gdrdma) for channel in report.channels] == [
        (5, "nodea", "mlx5_0", True), (5, "nodeb", "mlx5_5", True),
        (6, "nodea", "mlx5_1", True), (6, "nodeb", "mlx5_4", False),
        (7, "nodeb", "mlx5_5", True),
        (8, "nodea", "mlx5_1", None), (8, "nodeb", "mlx5_5", True),
        (9, "nodea", "mlx5_0", None)]
    assert report.hosts == ("nodea", "nodeb")
    assert (report.gdrdma_channels, report.host_memory_channels, report.unknown_channels) == (5, 1, 2)
    assert report.nics[0].gdr_capable is True       # behind "[default0]:[timestamp] "


def test_a_record_a_terminal_wrapped_in_a_paste_is_joined_with_its_end_and_said_so():
    """A paste from a terminal that wrapped one record: "... via" then " NET/IBext/4/GDRDMA"."""
    report = fixture("wrapped-paste-nccl-2.11.4.log")
    assert (report.network_channels, report.gdrdma_channels, report.joined_records) == (9, 9, 1)
    assert [(channel.line, channel.nic_name, channel.gdrdma) for channel in report.channels][-2:] == [
        (11, "mlx5_4", True), (13, "mlx5_4", True)]
    assert any("1 record(s) split across a line break" in text for text in report.conclusions)
    assert report.lines_read == 14 and report.unrecognised_lines == 0


HEAD = "n1:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
SEND = "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via"


@pytest.mark.parametrize("first, second, joined, gdrdma", [
    (SEND, " NET/IB/4/GDRDMA", 1, True),              # the space kept at the wrap
    (SEND, "NET/IB/4/GDRDMA", 1, True),               # the copy dropped it
    (SEND + " NET/IB/4", "/GDRDMA", 1, True),         # the suffix on the next line
    (SEND + " NET/IB/4/GDR", "DMA\r", 1, True),
    (SEND + " NET/IB/4", "epoch 1 loss 0.25", 0, False),     # a line of its own
    (SEND + " NET/IB/4", "n1:1:2 [0] NCCL INFO Connected all rings", 0, False),
    (SEND + " NET/IB/4", "", 0, False),
    (SEND, " NET/IB/4/GDRDMA and more", 0, None),     # not only the record's end: not joined
])
def test_only_a_line_that_can_only_be_the_records_end_is_joined(first, second, joined, gdrdma):
    report = parse_nccl_log(HEAD + first + "\n" + second + "\n")
    assert report.joined_records == joined
    assert [channel.gdrdma for channel in report.channels] == ([] if gdrdma is None else [gdrdma])


def test_a_cut_gdr_suffix_is_never_host_memory():
    text = ("n1:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
            "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDR")
    report = parse_nccl_log(text)
    assert (report.verdict, report.host_memory_channels, report.unknown_channels) == ("unknown", 0, 1)
    assert report.exit_code == ExitCode.NOT_TESTABLE
    # Without a line end even a suffix-less line may have been cut there.
    report = parse_nccl_log(text.replace("/GDR", ""))
    assert report.channels[0].gdrdma is None
    assert parse_nccl_log(text.replace("/GDR", "") + "\n").channels[0].gdrdma is False


def test_an_unknown_suffix_is_not_recognised_a_cut_one_is_cut():
    head = "n1:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    channel = "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0"
    unknown = parse_nccl_log(head + channel + "/NVLSDMA\n")
    assert (unknown.verdict, unknown.unrecognised_lines, unknown.network_channels) == ("unknown", 1, 0)
    for cut in ("/GDR", "(PC", "(1", "/Sha"):
        report = parse_nccl_log(head + channel + cut + "\n")
        assert (report.unknown_channels, report.unrecognised_lines) == (1, 0), cut


def test_records_split_where_each_nccl_prefix_starts():
    glued = ("a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA"
             "b:3:4 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[1] [send] via NET/IB/0")
    first, second = log_formats.records(glued)
    assert first.message.endswith("/GDRDMAb:3:4 [1] ") and second.glued
    spaced = glued.replace("GDRDMAb", "GDRDMA b")
    first, second = log_formats.records(spaced)
    assert (first.message.endswith("/GDRDMA "), second.host, second.glued) == (True, "b", False)


# ---- item 12: DMA-BUF --------------------------------------------------------------------


def test_a_plugin_dmabuf_line_with_the_gpu_line_proves_dmabuf():
    report = fixture("ibext_v8-nccl-2.19.4.log")
    mlx5_0, mlx5_1 = report.nics
    assert mlx5_0.gdr_paths == ("nvidia-peermem", "DMA-BUF")
    assert mlx5_0.gdr_mechanism.startswith("DMA-BUF")
    assert mlx5_1.gdr_mechanism is None       # only peer memory offered in the lines: not said
    assert report.mechanism == "per NIC: mlx5_0: DMA-BUF; mlx5_1: not said"


def test_dmabuf_offered_but_nccl_says_disabled():
    report = fixture("rdma-plugin-v10-nccl-2.26.6.log")
    assert report.nics[0].gdr_paths == ("DMA-BUF",)
    assert any("NCCL's own DMA-BUF support was off" in text for text in report.conclusions)


# ---- item 13: honest answers -------------------------------------------------------------


def test_the_mechanism_is_never_guessed_from_a_missing_line():
    report = fixture("nccl-2.18.5-nvml.log")      # GDRDMA used, no plugin line on the path
    assert report.mechanism.startswith("not said")
    assert all(nic.gdr_mechanism is None for nic in report.nics)


@pytest.mark.parametrize("name", ["nccl-2.4.8-ring.log", "nccl-2.12.12-pxn.log"])
def test_nccl_before_2_13_registers_through_peer_memory(name):
    assert fixture(name).mechanism.startswith("peer memory (nvidia-peermem): NCCL 2.")


def test_dmabuf_disabled_by_the_job():
    text = ("n1:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
            "n1:1:2 [0] NCCL INFO NCCL_DMABUF_ENABLE set by environment to 0.\n"
            "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n")
    report = parse_nccl_log(text)
    assert report.mechanism.startswith("peer memory (nvidia-peermem): NCCL_DMABUF_ENABLE=0")
    assert report.env == ("NCCL_DMABUF_ENABLE=0",)


def test_lines_in_a_format_not_recognised_are_counted_and_said():
    report = fixture("unrecognised-format.log")
    assert (report.unrecognised_lines, report.network_channels) == (3, 0)
    assert report.unrecognised_examples[0].line == 2
    assert any(text.startswith("3 network line(s) in a format not recognised") for text in report.cannot_conclude)
    assert not report.mechanism.startswith("none")


def test_no_network_channels_only_when_there_are_none():
    report = fixture("single-node-nccl-2.21.5.log")
    assert (report.verdict, report.local_channels) == ("no-net-channels", 2)
    assert report.cannot_conclude[0].startswith("no network channel lines (only 2 inside a node)")
    for row in EXPECTED:
        if fixture(row[0]).network_channels or fixture(row[0]).unrecognised_lines:
            assert fixture(row[0]).verdict != "no-net-channels"


def test_gdr_off_on_every_nic_exits_non_zero():
    report = fixture("gdr-off-every-nic-nccl-2.18.5.log")
    assert report.exit_code == ExitCode.VERDICT_NOT_OK
    assert all(nic.gdr_capable is False for nic in report.nics)
    assert report.mechanism.startswith("none: GPUDirect RDMA was off on every NIC")


def contradictions(report) -> list[str]:
    """Statements of one report that cannot all be true."""
    found = []
    said = " ".join(report.conclusions)
    if report.verdict in ("gdr-none", "socket", "gdr-unavailable") and report.gdrdma_channels:
        found.append("GDR unused, yet GDRDMA channels")
    if report.verdict == "gdr-all" and "through host memory" in said:
        found.append("all GDR, yet host memory")
    if report.verdict == "no-net-channels" and (report.network_channels or "connections used" in said):
        found.append("no network channels, yet some")
    if report.mechanism.startswith("none") and report.gdrdma_channels:
        found.append("mechanism none, yet GDRDMA")
    for nic in report.nics:
        label = f"NIC {nic.name}"
        if nic.gdrdma_channels and f"unavailable on {label}" in said:
            found.append(f"{label}: unavailable and used")
    return found


@pytest.mark.parametrize("name", [row[0] for row in EXPECTED])
def test_no_report_contradicts_itself(name):
    assert contradictions(fixture(name)) == []


@pytest.mark.parametrize("content, cause", [
    (b"", "is empty"),
    (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8, "not text"),
    # mtime=0: the header would carry the time, and a test's id must be the same in every
    # process that collects it (pytest-xdist's workers compare their collections)
    (gzip.compress(b"n1:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n", mtime=0),
     "gzip-compressed"),
    (b"epoch 1 loss 0.3\nepoch 2 loss 0.2\n", "no NCCL line"),
])
def test_what_is_not_an_nccl_log_is_a_usage_error(tmp_path, content, cause):
    path = tmp_path / "train.log"
    path.write_bytes(content)
    with pytest.raises(UsageError) as raised:
        read_nccl_log(str(path))
    assert cause in str(raised.value) and raised.value.fix
    assert raised.value.exit_code == ExitCode.USAGE



def test_a_pipe_written_in_pieces_reads_as_the_file_does(tmp_path):
    """<(zcat log.gz) and a FIFO arrive in pieces, with pauses: read whole, as the file is
    (the pipe is read only when poll() says it has data, so a signal is never stuck)."""
    name = "messy-paste-nccl-2.21.5.log"
    data = (FIXTURES / name).read_bytes()
    fifo = tmp_path / "piped.log"
    os.mkfifo(fifo)

    def write_in_pieces():
        with open(fifo, "wb", buffering=0) as writer:
            for start in range(0, len(data), 97):     # a record split across pieces
                writer.write(data[start:start + 97])
                time.sleep(0.002)

    writer = threading.Thread(target=write_in_pieces, daemon=True)
    writer.start()
    piped = read_nccl_log(str(fifo), lines=True)
    writer.join(timeout=60)
    assert to_json(piped).replace(str(fifo), "") == \
        to_json(fixture(name)).replace(str(FIXTURES / name), "")

# ---- the earlier cases, kept -------------------------------------------------------------

NCCL_2_30_GDR = """\
node1:4242:4242 [0] NCCL INFO NCCL version 2.30.7+cuda12.9
node1:4242:4242 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>
node1:4242:4242 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'
node1:4242:4242 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 1 'mlx5_1'
node1:4242:4242 [0] NCCL INFO DMA-BUF is available on GPU device 0
node1:4242:4300 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
node1:4242:4300 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1/GDRDMA(PCI)/Shared
node1:4242:4300 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0(1)/GDRDMA
"""


def test_2_30_all_channels_gdr_with_dmabuf_offered():
    report = parse_nccl_log(NCCL_2_30_GDR, source="rank0.log")
    assert (report.nccl_version, report.verdict) == ("2.30.7", "gdr-all")
    assert [(n.name, n.port, n.link_layer, n.gdr_capable, n.gdrdma_channels) for n in report.nics] == [
        ("mlx5_0", 1, "RoCE", True, 2), ("mlx5_1", 1, "RoCE", True, 1)]
    pxn, = [c for c in report.channels if c.proxy_rank is not None]
    assert (pxn.proxy_rank, pxn.direction, pxn.nic_name) == (1, "receive", "mlx5_0")
    shared, = [c for c in report.channels if c.shared]
    assert shared.pci_mapping and shared.line == 7
    assert any("TRACE" in text for text in report.cannot_conclude)


def test_lines_kept_or_not_the_summary_is_the_same():
    """The summary (read fast, most lines in one match) equals the one read record by record."""
    for name, *_ in EXPECTED:
        summary, whole = fixture(name, lines=False), fixture(name, lines=True)
        assert summary.channels == () and len(whole.channels) == whole.network_channels
        assert summary == type(summary)(**{**whole.__dict__, "channels": ()})


def test_the_report_serialises_with_its_kind():
    document = json.loads(to_json(parse_nccl_log(NCCL_2_30_GDR)))
    assert document["kind"] == "nccl-log"
    assert document["channels"][0]["gdrdma"] is True
    assert document["nics"][0]["transport"] == "IB"


def test_a_large_job_prints_one_row_per_nic_name():
    from gdrprobe.report.text import render_nccl_log

    text = "".join(f"node{host}:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:x<0>\n"
                   f"node{host}:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
                   for host in range(40))
    report = parse_nccl_log(text, lines=False)
    assert len(report.nics) == 80
    rows = [line for line in render_nccl_log(report).splitlines() if "40 host(s):" in line]
    assert len(rows) == 2 and "mlx5_0:1/IB" in rows[0] and "40 channel(s) GDRDMA" in rows[0]


# ---- the command ---------------------------------------------------------------------------


def run_cli(argv):
    # cli.build_parser's command list is owned elsewhere; register this command on a parser
    # of its own.
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_command_summary_by_default_lines_when_asked(capsys):
    path = str(FIXTURES / "nccl-2.18.5-nvml.log")
    assert run_cli(["nccl-log", path, "--json"]) == ExitCode.OK
    document = json.loads(capsys.readouterr().out)
    assert (document["verdict"], document["channels"], document["network_channels"]) == ("gdr-some", [], 3)
    assert run_cli(["nccl-log", path, "--json", "--lines"]) == ExitCode.OK
    assert len(json.loads(capsys.readouterr().out)["channels"]) == 3
    assert run_cli(["nccl-log", path, "--lines"]) == ExitCode.OK
    human = capsys.readouterr().out
    assert "verdict: gdr-some" in human and "via NET/IB/mlx5_1: host memory" in human


def test_command_exit_codes(capsys):
    assert run_cli(["nccl-log", str(FIXTURES / "socket-nccl-2.21.5.log")]) == ExitCode.VERDICT_NOT_OK
    assert run_cli(["nccl-log", str(FIXTURES / "unrecognised-format.log")]) == ExitCode.NOT_TESTABLE
    assert "format not recognised" in capsys.readouterr().out


def test_command_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as raised:
        run_cli(["nccl-log", str(tmp_path / "absent.log")])
    assert "cannot read NCCL log" in str(raised.value)
    assert raised.value.exit_code == ExitCode.USAGE


# ---- RCCL's own lines (issue 33; ROCm/rccl 0cbce2a7: net_ib.cc ncclIbGdrSupport, rocmwrap.cc) --


def test_rccl_log_is_named_rccl_with_its_version_from_its_own_line():
    report = fixture("rccl-2.21.5-peermem-amdkfd.log")
    assert (report.library, report.nccl_version) == ("RCCL", "2.21.5")
    assert fixture("nccl-2.21.5-merged.log").library == "NCCL"
    assert render_nccl_log(report).startswith("RCCL log ")


def test_rccl_peer_memory_found_in_each_place_and_dmabuf_off_without_the_variable():
    report = fixture("rccl-2.21.5-peermem-amdkfd.log")
    assert report.mechanism == ("peer memory (amdkfd): RCCL's DMA-BUF is off unless "
                                "NCCL_DMABUF_ENABLE=1 (its default is 0)")
    assert {nic.gdr_mechanism for nic in report.nics} == {report.mechanism}
    assert "mi300a: RCCL found peer memory (amdkfd): /sys/kernel/mm/memory_peers/amdkfd/version" in report.conclusions
    assert ("mi300b: RCCL found peer memory (amdkfd): ib_register_peer_memory_client in /proc/kallsyms"
            in report.conclusions)
    # RCCL's channel lines carry " comm %p nRanks %02d" after the suffix: read, not unrecognised.
    assert (report.gdrdma_channels, report.unrecognised_lines, report.local_channels) == (4, 0, 1)


def test_rccl_without_peer_memory_or_dmabuf_says_why_each_nic_is_disabled():
    report = fixture("rccl-2.21.5-gdrdma-not-enabled.log")
    (nic,) = report.nics
    assert nic.gdr_capable is False
    assert [reason.split(" (")[0] for reason in nic.gdr_disabled_because] == [
        "RCCL found no peer memory", "RCCL's DMA-BUF is off unless NCCL_DMABUF_ENABLE=1"]
    assert log_formats.NEITHER_PATH not in nic.gdr_disabled_because


def test_rccl_gdrdma_without_peer_memory_proves_dmabuf():
    report = fixture("rccl-2.21.5-dmabuf.log")
    assert report.mechanism.startswith("DMA-BUF: RCCL found no peer memory")
    assert "NCCL_DMABUF_ENABLE=1" in report.env


def test_rccl_both_ways_off_is_gdr_unavailable_without_a_nic_line():
    report = fixture("rccl-2.21.5-kernel-config.log")
    assert report.verdict == "gdr-unavailable"
    assert any("lacks CONFIG_DMABUF_MOVE_NOTIFY=y or CONFIG_PCI_P2PDMA=y" in text for text in report.conclusions)


RCCL_PREFIX = "{host}:1:1 [0] NCCL INFO "


def rccl_text(*records: tuple[str, str]) -> str:
    return "".join(RCCL_PREFIX.format(host=host) + message + "\n" for host, message in records)


def test_rccl_hyper_v_turns_found_peer_memory_off_and_the_override_turns_it_on():
    found = "Found /sys/kernel/memory_peers/amdkfd/version"
    missing = "GDRDMA not enabled. Could not find memory_peers directory or peer_memory symbol"
    forced = "RCCL_FORCE_ENABLE_GDRDMA = 1, so explicitly setting moduleLoaded = 1"
    off = "Dmabuf feature disabled without NCCL_DMABUF_ENABLE=1"
    hyper_v = parse_nccl_log(rccl_text(("h1", found), ("h1", missing), ("h1", off)))
    assert hyper_v.verdict == "gdr-unavailable"
    assert hyper_v.conclusions[0].startswith("h1: RCCL found no peer memory")
    forced_on = parse_nccl_log(rccl_text(("h1", forced), ("h1", missing), ("h1", off)))
    assert forced_on.verdict == "no-net-channels"
    assert forced_on.conclusions[0] == "h1: RCCL found peer memory (amdkfd): RCCL_FORCE_ENABLE_GDRDMA=1"


def test_rccl_gdr_off_on_one_host_only_is_not_off_everywhere():
    missing = "GDRDMA not enabled. Could not find memory_peers directory or peer_memory symbol"
    off = "Current version of ROCm does not support dmabuf feature."
    report = parse_nccl_log(rccl_text(("h1", missing), ("h1", off),
                                      ("h2", "Found /sys/memory_peers/amdkfd/version"), ("h2", off)))
    assert report.verdict == "no-net-channels"
    assert "h1: RCCL's DMA-BUF is off: HSA reports no DMA-BUF support (this ROCm or its driver)" in report.conclusions


def test_rccl_missing_export_symbol_is_read_from_its_warning():
    line = ("h1:1:1 [0] rocmwrap.cc:115 NCCL WARN Failed to load ROCr missing symbol "
            "hsa_amd_portable_export_dmabuf\n")
    report = parse_nccl_log(line)
    assert report.conclusions == ("h1: RCCL's DMA-BUF is off: libhsa-runtime64 has no "
                                  "hsa_amd_portable_export_dmabuf",)
