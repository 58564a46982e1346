"""What a check (:class:`~gdrprobe.report.check.CheckReport`, or a node's
:class:`~gdrprobe.report.check.NodeCheckReport`) becomes for Prometheus: node-exporter
text-file metrics, written atomically. The names are ``bench``'s (its gauges are reused from
:mod:`gdrprobe.report.bench`, with a ``node`` label added), plus the check's exit code per
GPU and its time stamp per node, which the alert rules in deploy/prometheus/ read.

prometheus_client (``pip install gdrprobe[prometheus]``) is imported only when a file is
written; :func:`check_prometheus_file` refuses its absence before anything is measured.
"""

from __future__ import annotations

import os
import socket
import statistics

from gdrprobe.errors import ExitCode
from gdrprobe.report.bench import (BYTES_PER_SECOND_PER_GBPS, check_output_file, engaged_gauge,
                                   in_base_units, require_prometheus, row_gauges, write_registry)
from gdrprobe.report.check import ENGAGED, CheckReport, NodeCheckReport, RailsReport

NODE_LABELS = ("node",)
GPU_LABELS = ("gpu", "nic", "node")
EXIT_CODE_METRIC = "gdrprobe_check_exit_code"
TIMESTAMP_METRIC = "gdrprobe_check_timestamp_seconds"
RAIL_RATIO_METRIC = "gdrprobe_rail_concurrent_ratio"
RAILS_EXIT_CODE_METRIC = "gdrprobe_rails_exit_code"
AGGREGATE_METRIC = "gdrprobe_rails_aggregate_bytes_per_second"
SOLO_SUM_METRIC = "gdrprobe_rails_solo_sum_bytes_per_second"
# The node label where the host's name is not the node's: in a pod, whose host name is the
# pod's, the DaemonSet sets it from spec.nodeName (the downward API).
NODE_ENV = "GDRPROBE_NODE_NAME"


def node_name() -> str:
    return os.environ.get(NODE_ENV) or socket.gethostname()


def check_prometheus_file(path: str, flag: str = "--prometheus") -> None:
    """Refuse, before anything is measured, a file that could not be written when the check
    ends, and a missing prometheus_client."""
    check_output_file(path, flag)
    require_prometheus()


def write_check_prometheus(report: CheckReport | NodeCheckReport, path: str,
                           node: str | None = None) -> None:
    """The check's metrics into path (a ``.prom`` file in node_exporter's
    ``--collector.textfile.directory``), replaced atomically. node: the node label
    (default: $GDRPROBE_NODE_NAME, else this host's name)."""
    registry = check_registry(_entries(report), node or node_name())
    if isinstance(report, NodeCheckReport) and report.rails is not None:
        add_rails(registry, report.rails, node or node_name())
    write_registry(registry, path)


def add_rails(registry, rails: RailsReport, node: str) -> None:
    """All rails at once: the rails' exit code per node; per rail its GPU arm together over
    alone; per node the aggregate and the sum of the rails alone (bytes per second) where
    the rails ran together."""
    from prometheus_client import Gauge

    Gauge(RAILS_EXIT_CODE_METRIC, "the exit code of all rails at once (0: together or one "
          "rail, 12: inconclusive, 13: contention)", list(NODE_LABELS),
          registry=registry).labels(node).set(rails.exit_code)
    if rails.exit_code == ExitCode.INCONCLUSIVE or not rails.rails:
        return       # an answer not known says nothing of the rails together
    ratio = Gauge(RAIL_RATIO_METRIC, "a rail's GPU-arm bandwidth with every rail running over "
                  "its bandwidth alone", list(GPU_LABELS), registry=registry)
    for rail in rails.rails:
        if rail.ratio is not None:
            ratio.labels(rail.gpu, rail.nic, node).set(rail.ratio)
    for name, what, value in ((AGGREGATE_METRIC, "the rails' GPU arms together, summed",
                               rails.aggregate_gbps),
                              (SOLO_SUM_METRIC, "the rails' GPU arms alone, summed",
                               rails.solo_sum_gbps)):
        Gauge(name, what, list(NODE_LABELS), registry=registry).labels(node).set(
            value * BYTES_PER_SECOND_PER_GBPS)


def write_check_error(exit_code: int, path: str, gpu: str = "", nic: str = "",
                      node: str | None = None) -> None:
    """A check that ended in an error before its report (no RDMA device, say): its exit
    code and time stamp alone, so an alert sees the node as checked and not passing."""
    write_registry(check_registry([(gpu, nic, int(exit_code), None)], node or node_name()),
                   path)


def _entries(report: CheckReport | NodeCheckReport) -> list[tuple]:
    """(GPU, NIC, exit code, CheckReport or None) per GPU checked."""
    if isinstance(report, NodeCheckReport):
        return [(gpu.gpu, gpu.nic or "", gpu.exit_code, gpu.report) for gpu in report.gpus]
    pair = report.placement
    return [(pair.gpu if pair else "", (pair.nic or "") if pair else "",
             report.verdict.exit_code, report)]


def check_registry(entries: list[tuple], node: str):
    """The registry: per GPU its exit code, whether GDR is engaged (where the verdict says
    something about GPUDirect: not for "not testable", "inconclusive" or an error), and per
    measured arm
    bench's bandwidth, GPU/host ratio and line-rate fraction; per node the time stamp."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    exit_code = Gauge(EXIT_CODE_METRIC, "the exit code of gdrprobe check for the GPU (0: "
                      "engaged; the README's 'Exit codes' table says which drain)",
                      list(GPU_LABELS), registry=registry)
    engaged = engaged_gauge(registry, NODE_LABELS)
    gauges = row_gauges(registry, NODE_LABELS)
    for gpu, nic, code, report in entries:
        exit_code.labels(gpu, nic, node).set(code)
        if report is None or code == ExitCode.NOT_TESTABLE:
            continue
        if code != ExitCode.INCONCLUSIVE:     # an answer not known says nothing of GDR either
            engaged.labels(gpu, nic, node).set(int(report.verdict.classification == ENGAGED))
        for memory, size, values in _arm_values(report):
            labels = (gpu, nic, memory, str(report.settings.qps), str(size), node)
            for field, value in values.items():
                if value is not None:
                    gauges[field].labels(*labels).set(in_base_units(field, value))
    Gauge(TIMESTAMP_METRIC, "when gdrprobe check ended on the node (Unix time)",
          list(NODE_LABELS), registry=registry).labels(node).set_to_current_time()
    return registry


def _arm_values(report: CheckReport):
    """(memory label, size, {bench's row field: value}) per measured arm: the median of its
    repeats, its GPU/host ratio from the verdict. A one-direction arm's label names it."""
    ratios = {(arm.arm, arm.direction): arm.ratio for arm in report.verdict.arms}
    for arm in report.arms:
        if arm.outcome != "measured" or not arm.bandwidths_gbps:
            continue
        memory = arm.arm if arm.direction in ("", "both") else f"{arm.arm}:{arm.direction}"
        yield memory, arm.size_bytes, {
            "bandwidth_avg_gbps": statistics.median(arm.bandwidths_gbps),
            "gpu_host_ratio": ratios.get((arm.arm, arm.direction)),
            "line_rate_fraction": arm.line_rate_fraction}
