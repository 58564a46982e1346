"""2.31's own diagnostics in a log: with ``NCCL_RUN_DIAGNOSTICS=1`` NCCL checks at each
communicator's start that the GPU-to-GPU peer paths it will use work (the P2P check: each GPU
of a pair NCCL expects to talk to directly, over NVLink or PCIe, reads and writes its peer's
memory), and rank 0's process prints a report on its standard output, each line after
``NCCL DIAG `` (NVIDIA/nccl ``src/diagnostics.cc`` ncclRunDiagnosticsActive,
``src/diagnostics/p2p.cc``; its user guide, troubleshooting "Diagnostics"): a header, one
result per check tagged ``[OK]`` or ``[INFO]`` (a failed verification, or a check that could
not complete: "p2p: only 52/56 GPU-to-GPU peer accesses passed verification", "p2p: active
check returned 5"), and "NCCL diagnostics completed in 245.3 ms across 8 ranks".

The results are NCCL's, informational (NCCL goes on either way), and about the paths inside a
node, not the network: the report says them as they are, beside the network's answer, and an
``[INFO]`` result is named because a PXN relay rides that same NVLink path. The format
(:data:`gdrprobe.nccl.log_formats.DIAG_FORMATS`) is read in :mod:`gdrprobe.nccl.log_formats`.
"""

from __future__ import annotations

from gdrprobe.report.nccl_log import DiagnosticResult

MAX_RESULTS = 64            # distinct results kept (host, tag, check, text); the rest counted


def read_diag(scan, number: int, host: str, match, cut: bool) -> None:
    """One line of the report: the results kept by what they say, the runs by their size."""
    if cut:
        return
    diag = scan.diag
    if match.group("ranks"):
        runs = diag.setdefault("runs", {})
        runs[host] = runs.get(host, 0) + 1
        return
    if not match.group("tag"):
        return
    key = (host, match.group("tag"), scan.names(match.group("check")), scan.values(match.group("text")))
    results = diag.setdefault("results", {})
    if key in results or len(results) < MAX_RESULTS:
        results[key] = results.get(key, 0) + 1
    else:
        scan.count_past("diagnostics")


def results(scan) -> tuple[DiagnosticResult, ...]:
    return tuple(DiagnosticResult(host, tag, check, text, count)
                 for (host, tag, check, text), count in scan.diag.get("results", {}).items())


def sentences(scan) -> list[str]:
    """What the report says of them: each [INFO] result, and how many checks passed."""
    found = results(scan)
    runs = sum(scan.diag.get("runs", {}).values())
    if not found and not runs:
        return []
    said = [f"NCCL's own diagnostics (NCCL_RUN_DIAGNOSTICS, 2.31+) reported {len(found)} result(s) from "
            f"{runs} completed run(s) at communicator start"]
    for result in found:
        where = f"{result.host}: " if result.host else ""
        if result.tag == "INFO":
            said.append(f"{where}NCCL's diagnostics flagged {result.check}: {result.text} (GPU-to-GPU paths "
                        "inside the node, NVLink or PCIe, which PXN relays ride too; not the network)")
        else:
            said.append(f"{where}NCCL's diagnostics passed {result.check}: {result.text}")
    return said
