"""NCCL's pattern over real verbs in one guest (loopback: the server thread takes the
receiver's part): every step checked, the connections as the job's NCCL settings make them,
a clear-to-send the sender may not send into refused, nothing left registered."""

from __future__ import annotations

import json
import os

import pytest

from tests.lab.helpers import gdrprobe, rdma_resources

pytest.importorskip("gdrprobe._nccl")


@pytest.mark.parametrize("environ", [
    {},
    {"NCCL_IB_QPS_PER_CONNECTION": "3", "NCCL_IB_SPLIT_DATA_ON_QPS": "1",
     "NCCL_NCHANNELS_PER_NET_PEER": "2", "NCCL_IB_USE_INLINE": "1"},
    {"NCCL_IB_QPS_PER_CONNECTION": "2", "NCCL_IB_ADAPTIVE_ROUTING": "1",
     "NCCL_P2P_NET_CHUNKSIZE": "65536"}])
def test_every_step_of_ncclS_pattern_is_checked_as_the_settings_shape_it(environ):
    before = rdma_resources()
    done = gdrprobe("run", "--loopback", "--pattern", "nccl", "-n", "24", "-q", "2", "--json",
                    env={**os.environ, **environ}, timeout=600, check=True)
    report = json.loads(done.stdout)
    channels = int(environ.get("NCCL_NCHANNELS_PER_NET_PEER", 1))
    qps = int(environ.get("NCCL_IB_QPS_PER_CONNECTION", 1))
    for row in report["nccl"]:
        assert (row["channels"], row["qps_per_connection"]) == (channels, qps)
        assert row["integrity"]["bad_bytes"] == 0 and row["integrity"]["stray_bytes"] == 0
        assert row["integrity"]["messages_checked"] == row["integrity"]["messages_total"]
        assert row["integrity"]["messages_total"] >= 24 * channels
        assert row["steps"] >= 24 and row["ceiling_gbps"] > 0
    assert [a["size_bytes"] for a in report["nccl_answers"]] == \
        [row["size_bytes"] for row in report["nccl"]]
    assert rdma_resources() == before


def test_a_pattern_with_a_latency_run_is_refused_before_anything_runs():
    done = gdrprobe("run", "--loopback", "--pattern", "nccl", "--latency")
    assert done.returncode == 2
    assert "--pattern nccl measures WRITE bandwidth" in done.stderr
