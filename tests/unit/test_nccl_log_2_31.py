"""`gdrprobe nccl-log` on NCCL 2.31's lines (issue 39 item 9): the receive channel line that
says NCCL's flush (src/transport/net.cc recvSetup, the dev branch at 2.31.0a7:
"via NET/%s/%d%s%s%s%s%s" with "/flush=" and ncclTopoFlushTypeStr's None, Always, C2c), and
the diagnostics block NCCL_RUN_DIAGNOSTICS=1 prints on rank 0's standard output (src/
diagnostics.cc ncclRunDiagnosticsActive: "NCCL DIAG ..." after "host:pid "). Hosts and
ranks are made up."""

from __future__ import annotations

from gdrprobe.nccl.log import parse_nccl_log
from gdrprobe.report.model import to_dict

LOG_2_31 = """\
node1:4242:4242 [0] NCCL INFO NCCL version 2.31.2+cuda13.0
node1:4242:4250 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA/flush=Always
node1:4242:4250 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA/Shared/flush=None
node1:4242:4250 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
node2:5151:5160 [1] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [receive] via NET/IB/1/GDRDMA(PCI)/flush=C2c
"""


def test_the_flush_suffix_of_2_31_is_read_not_called_unrecognised():
    """Was: "format not recognised" for every GDR receive line of 2.31."""
    for lines in (True, False):       # record by record, and the fast path of large logs
        report = parse_nccl_log(LOG_2_31, lines=lines)
        assert (report.verdict, report.gdrdma_channels, report.unrecognised_lines) == ("gdr-all", 4, 0)
        assert ("NCCL printed its flush of GDR receives (2.31+, net.cc recvSetup): Always on 1 connection(s), "
                "C2c on 1 connection(s), None on 1 connection(s)") in report.conclusions
    report = parse_nccl_log(LOG_2_31)
    assert [c.flush for c in report.channels] == ["Always", "None", None, "C2c"]
    assert [c.pci_mapping for c in report.channels] == [False, False, False, True]
    assert "channel (2.12-2.31)" in report.formats_read


def test_a_flush_suffix_cut_short_is_a_cut_line():
    report = parse_nccl_log("node1:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via "
                            "NET/IB/0/GDRDMA/flush=Alw")
    assert (report.unrecognised_lines, report.gdrdma_channels) == (0, 1)


DIAG = """\
node1:4242:4242 [0] NCCL INFO NCCL version 2.31.2+cuda13.0
node1:4242 NCCL DIAG === NCCL Diagnostics ===
node1:4242 NCCL DIAG [INFO] p2p: only 52/56 GPU-to-GPU peer accesses passed verification
node1:4242 NCCL DIAG NCCL diagnostics completed in 245.3 ms across 8 ranks
NCCL DIAG === NCCL Diagnostics ===
NCCL DIAG [OK]   p2p: verified P2P access in both directions between every GPU pair (56 peer accesses)
NCCL DIAG NCCL diagnostics completed in 201.0 ms across 8 ranks
node1:4242:4250 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA/flush=None
"""


def test_the_diagnostics_block_of_2_31_is_said_as_nccl_printed_it():
    report = parse_nccl_log(DIAG)
    assert [(d.host, d.tag, d.check, d.text) for d in report.diagnostics] == [
        ("node1", "INFO", "p2p", "only 52/56 GPU-to-GPU peer accesses passed verification"),
        ("", "OK", "p2p", "verified P2P access in both directions between every GPU pair (56 peer accesses)")]
    said = " | ".join(report.conclusions)
    assert "NCCL's own diagnostics (NCCL_RUN_DIAGNOSTICS, 2.31+) reported 2 result(s) from 2 completed run(s)" in said
    assert "node1: NCCL's diagnostics flagged p2p: only 52/56" in said
    assert report.verdict == "gdr-all" and report.unrecognised_lines == 0      # the network's answer stands
    assert "diag (2.31)" in report.formats_read
    assert to_dict(report)["diagnostics"][0]["tag"] == "INFO"


def test_a_stdout_capture_holding_only_the_diagnostics_is_an_nccl_log():
    report = parse_nccl_log("NCCL DIAG === NCCL Diagnostics ===\n"
                            "NCCL DIAG [INFO] p2p: active check returned 5\n")
    assert [(d.tag, d.text) for d in report.diagnostics] == [("INFO", "active check returned 5")]
    assert report.verdict == "no-net-channels"
