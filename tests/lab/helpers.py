"""Shared by the lab suites, which run inside Soft-RoCE guests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gdrprobe(*args: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    """Run the CLI as a user would, in a process of its own."""
    done = subprocess.run([sys.executable, "-m", "gdrprobe", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    if check and done.returncode != 0:
        raise AssertionError(f"gdrprobe {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def gdrprobe_json(*args: str, timeout: float = 300) -> dict:
    return json.loads(gdrprobe(*args, "--json", timeout=timeout, check=True).stdout)


def rdma_resources() -> dict[str, int]:
    """How many QPs, CQs, PDs and MRs exist on the guest, from 'rdma resource show'."""
    out = subprocess.run(["rdma", "resource", "show"], capture_output=True, text=True,
                         check=True).stdout
    counts = {}
    for token in ("qp", "cq", "pd", "mr"):
        for line in out.splitlines():
            fields = line.split()
            if token in fields:
                counts[token] = int(fields[fields.index(token) + 1])
    return counts
