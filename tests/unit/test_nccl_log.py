"""NCCL INFO logs in the formats of several NCCL versions, written from the documented line formats."""

from __future__ import annotations

import json

from gdrprobe.cli import nccl_log as command
from gdrprobe.nccl import log as nccl_log
from gdrprobe.errors import ExitCode, UsageError
from gdrprobe.nccl.log import parse_nccl_log
from gdrprobe.report.model import to_json

import pytest

# NCCL 2.30: per-pair decisions are TRACE-only; channels carry "Channel 00/0" and rank[dev].
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

# NCCL 2.18: per-pair lines at INFO, older "Channel 00 :" and bus-id style device fields.
NCCL_2_18_PARTIAL = """\
NCCL INFO NCCL version 2.18.5+cuda12.2
NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:192.168.1.1<0>
NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1'
NCCL INFO GPU Direct RDMA Disabled for GPU 9b000 / HCA 1 (distance 5 > 4)
NCCL INFO Channel 00 : 0[1b000] -> 1[1b000] [send] via NET/IB/0/GDRDMA
NCCL INFO Channel 01 : 0[9b000] -> 1[9b000] [send] via NET/IB/1
"""

NCCL_SOCKET = """\
NCCL INFO NCCL version 2.21.5+cuda12.4
NCCL INFO NCCL_IB_DISABLE set by environment to 1.
NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""

NCCL_SINGLE_NODE = """\
NCCL INFO NCCL version 2.30.7+cuda12.9
NCCL INFO DMA-BUF is available on GPU device 0
NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
"""


def test_2_30_all_channels_gdr_with_dmabuf_offered():
    report = parse_nccl_log(NCCL_2_30_GDR, source="rank0.log")
    assert report.nccl_version == "2.30.7"
    assert report.verdict == "gdr-all"
    assert report.mechanism.startswith("DMA-BUF or nvidia-peermem")
    assert [(n.name, n.port, n.link_layer, n.gdr_capable, n.gdrdma_channels) for n in report.nics] == [
        ("mlx5_0", 1, "RoCE", True, 2), ("mlx5_1", 1, "RoCE", True, 1)]
    pxn, = [c for c in report.channels if c.proxy_rank is not None]
    assert (pxn.proxy_rank, pxn.direction, pxn.nic_name) == (1, "receive", "mlx5_0")
    shared, = [c for c in report.channels if c.shared]
    assert shared.pci_mapping and shared.line == 7
    assert any("TRACE" in text for text in report.cannot_conclude)
    assert any("prints even when GDR is off" in text for text in report.cannot_conclude)
    assert report.dmabuf_gpus == (0,)


def test_2_18_one_nic_without_gdr():
    report = parse_nccl_log(NCCL_2_18_PARTIAL)
    assert report.verdict == "gdr-some"
    assert report.mechanism.startswith("nvidia-peermem, most likely")
    nic1 = report.nics[1]
    assert (nic1.name, nic1.gdr_capable, nic1.gdrdma_channels, nic1.host_memory_channels) == ("mlx5_1", False, 0, 1)
    decision, = report.pair_decisions
    assert (decision.gpu, decision.nic, decision.enabled, decision.distance,
            decision.level) == ("9b000", "1", False, 5, 4)
    assert "1 of 2 network channel connections used GPUDirect RDMA (/GDRDMA)" in report.conclusions
    assert not any("TRACE" in text for text in report.cannot_conclude)


def test_socket_fallback():
    report = parse_nccl_log(NCCL_SOCKET)
    assert report.verdict == "socket"
    assert report.conclusions[0].startswith("NCCL used the socket transport")


def test_single_node_log_cannot_tell():
    report = parse_nccl_log(NCCL_SINGLE_NODE)
    assert report.verdict == "no-net-channels"
    assert report.mechanism.startswith("none")
    assert any("cannot be told" in text for text in report.cannot_conclude)


def test_report_serialises_with_its_kind():
    document = json.loads(to_json(parse_nccl_log(NCCL_2_30_GDR)))
    assert document["kind"] == "nccl-log"
    assert document["channels"][0]["gdrdma"] is True


def run_cli(argv):
    args = build_parser_with_command().parse_args(argv)
    return args.handler(args)


def build_parser_with_command():
    # cli.COMMAND_MODULES is owned elsewhere; register this command on a parser of its own.
    import argparse

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_command_human_and_json(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_2_18_PARTIAL)
    assert run_cli(["nccl-log", str(log)]) == ExitCode.OK
    human = capsys.readouterr().out
    assert "verdict: gdr-some" in human and "via NET/IB/mlx5_1: host memory" in human
    assert run_cli(["nccl-log", str(log), "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["verdict"] == "gdr-some"


def test_command_exit_code_when_gdr_unused(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_SOCKET)
    assert run_cli(["nccl-log", str(log)]) == ExitCode.VERDICT_NOT_OK


def test_command_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as raised:
        run_cli(["nccl-log", str(tmp_path / "absent.log")])
    assert "cannot read NCCL log" in str(raised.value)
    assert raised.value.exit_code == ExitCode.USAGE


def test_command_bounded_read(tmp_path, monkeypatch):
    monkeypatch.setattr(nccl_log, "MAX_LOG_BYTES", 10)
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_SOCKET)
    text, truncated = nccl_log.read_bounded(str(log))
    assert (len(text), truncated) == (10, True)
