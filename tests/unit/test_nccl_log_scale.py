"""`gdrprobe nccl-log` on a large log: the file is streamed, so memory stays bounded.

A 60 MB log (a job of many 8-GPU nodes, every rank's set-up and channel lines, written by
benchmarks/nccl_log_speed.py from NCCL 2.21's format strings) is read in a fresh process
whose peak resident size is its own. Speed is measured in that benchmark, not here.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOG_MB = 60
MAX_RSS_MIB = 200
# Each of the two children, inside the 120 s every unit test has (pyproject.toml): generous
# (the whole test takes seconds); no timing is asserted.
TIME_LIMIT_S = 50

# The peak is the child's own VmHWM, its address space's high-water mark, which starts afresh
# at exec: ru_maxrss would also count the parent's resident size at the fork (Linux keeps
# the larger across exec), and pytest's grows with the suite.
READ = ("import json, re, sys, gdrprobe; r = gdrprobe.read_nccl_log(sys.argv[1]); "
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()); "
        "print(json.dumps({'rss_mib': int(hwm.group(1)) / 1024, "
        "'verdict': r.verdict, 'network_channels': r.network_channels, 'channels': len(r.channels), "
        "'nics': len(r.nics), 'lines_read': r.lines_read}))")


def test_a_60_mb_log_is_read_whole_in_bounded_memory(tmp_path):
    log = tmp_path / "nccl.log"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nccl_log_speed.py"), "--write", str(log),
                    "--mb", str(LOG_MB)], check=True, timeout=TIME_LIMIT_S)
    assert log.stat().st_size >= LOG_MB << 20
    text = log.read_bytes()
    lines, network = text.count(b"\n"), text.count(b" via NET/")
    out = subprocess.run([sys.executable, "-c", READ, str(log)], capture_output=True, text=True,
                         check=True, timeout=TIME_LIMIT_S, cwd=ROOT).stdout
    result = json.loads(out)
    assert result["rss_mib"] <= MAX_RSS_MIB
    assert (result["verdict"], result["channels"], result["lines_read"]) == ("gdr-all", 0, lines)
    assert result["network_channels"] == network      # nothing dropped on the way
