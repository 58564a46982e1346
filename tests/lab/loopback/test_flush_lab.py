"""NCCL's flush on rxe: an RDMA READ of received bytes on a QP connected to itself
(gdrprobe/measure/flush.py, csrc/gdr_flush.c), as NCCL's ncclIbIflush issues it after every
GPUDirect receive.

First the primitive, over Debian's rxe with host memory: the READ brings back the byte the
buffer holds where it reads, whatever it is. Then, in the DMA-BUF lab (docs/dmabuf-lab.md:
the stand-in libcuda.so.1 exports its "device" memory as real dma-bufs, the patched rxe
registers them through the kernel's dma-buf import), with GPU (dma-buf) memory at both ends:
every check of every round is preceded by the READ, and each one brings back the first byte
of the last message written. Where the modules are not built, those tests skip.
"""

import json
import os
import subprocess
import sys

import pytest

from lab.dmabuf_guest import dmabuf_environment, run_dmabuf_ab
from tests.lab.helpers import REPO, rdma_resources

PRIMITIVE = r"""
import json
from gdrprobe import _native
from gdrprobe.measure.flush import Flusher
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions

stop = _native.StopFlag()
with Endpoint(EndpointOptions(device="rxe0", num_qps=1, tx_depth=1), None) as endpoint:
    with open_buffer(MemorySpec(), endpoint, 8192, True, False, read_back=True) as memory:
        _native.pattern_fill(memory.address, 8192, 7)
        with Flusher(endpoint, memory, stop) as flusher:
            reads = []
            for offset in (0, 1, 4095, 8191):
                expected = _native.pattern_byte(7, offset)
                reads.append([flusher.read_back(offset, expected).byte, expected])
            _native.poison_fill(memory.address + 100, 1)   # the buffer changes: so does the READ
            reads.append([flusher.read_back(100, _native.pattern_byte(7, 100)).byte, 0xA5])
print(json.dumps(reads))
"""

ROUNDS = r"""
import json, sys
from gdrprobe.measure.loopback import run_loopback
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma.endpoint import EndpointOptions

gpu = MemorySpec(kind="gpu", mechanism="dmabuf")
options = ProbeOptions(sizes=(4096, 1 << 20), iterations=40, flush=sys.argv[1],
                       sample_integrity=sys.argv[2] == "sample")
report = run_loopback(options, EndpointOptions(device="rxe0"), gpu, gpu)
print(json.dumps({"flush": report.settings.flush,
                  "mechanisms": [report.local.memory["mechanism"],
                                 report.remote.memory["mechanism"]],
                  "rounds": [{"size": row.size_bytes, "passes": row.integrity_passes,
                              "reads": row.integrity.flush_reads,
                              "flush_us": row.integrity.flush_us_median,
                              "bad": row.integrity.flush_bad, "ok": row.integrity.ok}
                             for row in report.bandwidth]}))
"""


def test_the_flush_read_brings_back_what_the_buffer_holds_there():
    if not os.path.exists("/sys/class/infiniband/rxe0"):
        pytest.skip("needs a lab guest (rxe0)")
    baseline = rdma_resources()
    done = subprocess.run([sys.executable, "-c", PRIMITIVE], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    reads = json.loads(done.stdout)
    assert all(landed == expected for landed, expected in reads), reads
    assert rdma_resources() == baseline     # the loopback QP, its CQ and the landing MR gone


def rounds(built, flush: str, integrity: str = "every") -> dict:
    done = subprocess.run([sys.executable, "-c", ROUNDS, flush, integrity],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dmabuf_environment(built))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_check_of_every_round_flushes_and_reads_back_the_last_written_byte(modules):  # noqa: F811
    baseline = rdma_resources()
    report = rounds(modules, "lab: every check")
    assert report["mechanisms"] == ["dmabuf", "dmabuf"], report
    assert report["flush"].endswith("lab: every check"), report
    for row in report["rounds"]:
        # One READ per check, each the byte the last message wrote (bad 0): every pass of
        # 4 slots of 1 MiB, the one pass of 40 4 KiB messages.
        assert row["reads"] == row["passes"] >= 1 and row["bad"] == 0 and row["ok"], row
        assert row["flush_us"] > 0, row      # NCCL's per-receive cost, timed
    assert max(row["passes"] for row in report["rounds"]) == 10
    assert rdma_resources() == baseline


def test_a_sampling_run_flushes_its_one_check_per_round(modules):  # noqa: F811
    report = rounds(modules, "lab: sampled", "sample")
    assert [(row["reads"], row["bad"]) for row in report["rounds"]] == [(1, 0), (1, 0)]


def test_without_a_rule_that_asks_nothing_is_read_back(modules):  # noqa: F811
    report = rounds(modules, "")
    assert report["flush"] == "" and {row["reads"] for row in report["rounds"]} == {0}


def test_run_flush_reports_the_flush_in_the_gpu_arms_settings(modules):  # noqa: F811
    baseline = rdma_resources()
    done, _ = run_dmabuf_ab(modules, "--remote-mem", "dmabuf", "--flush")
    report = json.loads(done.stdout)
    assert report["arms"][1]["outcome"] == "measured", (report["arms"], done.stderr)
    assert report["gpu_settings"]["flush"].endswith("asked for (run --flush)"), report
    assert report["settings"]["flush"] == ""      # the host arm: nothing NCCL would flush
    assert report["verdict"]["classification"] in ("engaged", "degraded")
    assert rdma_resources() == baseline


def test_check_flushes_its_gpu_receive_buffer(modules, tmp_path):  # noqa: F811
    """`gdrprobe check`: NCCL's rule for the GPU (the stand-in reports no compute capability,
    and the lab has no NCCL topology: flushed either way)."""
    env = dmabuf_environment(modules) | {"GDRPROBE_LOCK_DIR": str(tmp_path)}
    env.pop("LOCAL_RANK", None)
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "check", "--mem", "dmabuf",
                           "--time-budget", "120", "-s", "64K", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    report = json.loads(done.stdout)
    assert report["arms"][1]["outcome"] == "measured", (report["arms"], done.stderr)
    assert "as NCCL does: " in report["gpu_settings"]["flush"], report["gpu_settings"]


GPU_ROUNDS = r"""
import json, sys
from gdrprobe.measure.loopback import run_loopback
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma.endpoint import EndpointOptions

gpu = MemorySpec(kind="gpu", mechanism="dmabuf")
mode, opcode = sys.argv[1], sys.argv[2]
options = ProbeOptions(mode=mode, opcode=opcode, sizes=(4096, 1 << 20), iterations=10)
report = run_loopback(options, EndpointOptions(device="rxe0"), gpu, gpu)
rows = report.bandwidth or report.latency
print(json.dumps({"mechanisms": [report.local.memory["mechanism"],
                                 report.remote.memory["mechanism"]],
                  "perftest": report.settings.perftest,
                  "rows": [{"size": row.size_bytes, "checked": row.integrity.messages_checked,
                            "total": row.integrity.messages_total, "ok": row.integrity.ok,
                            "bytes": row.integrity.bytes_checked} for row in rows]}))
"""


@pytest.mark.parametrize("mode, opcode, program", [
    ("latency", "write_imm", "ib_write_lat --write_with_imm"),
    ("bandwidth", "read", "ib_read_bw"),
])
def test_gpu_memory_at_both_ends_latency_with_immediate_and_read(modules, mode, opcode,  # noqa: F811
                                                                  program):
    """Issue 31 in the DMA-BUF lab, GPU (dma-buf) memory at both ends: the ping-pong of
    WRITEs with immediate (no CPU polls GPU memory; each side's slots read back after each
    pass: 1 MiB has 4, so passes of 4, 4 and 2) and READ bandwidth, every message checked."""
    baseline = rdma_resources()
    done = subprocess.run([sys.executable, "-c", GPU_ROUNDS, mode, opcode],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dmabuf_environment(modules))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mechanisms"] == ["dmabuf", "dmabuf"] and report["perftest"] == program
    for row in report["rows"]:
        assert row["ok"] and row["checked"] == row["total"] == 10, row
        assert row["bytes"] == 10 * row["size"], row
    assert rdma_resources() == baseline
