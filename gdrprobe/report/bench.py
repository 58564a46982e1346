"""What a sweep (:class:`gdrprobe.report.model.BenchReport`) becomes: a table, CSV, JSON,
Prometheus text and PNG plots. Formatting only: every number and verdict is the model's.

matplotlib (``pip install gdrprobe[plot]``) and prometheus_client (``gdrprobe[prometheus]``)
are optional and imported only here, when their output is asked for.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from collections import defaultdict

from gdrprobe.errors import MissingDependency, UsageError, extra_fix
from gdrprobe.files import (NotRegularFile, check_output_path, parse_json, read_bounded,
                            replace_file, unwritable)
from gdrprobe.report.check import ENGAGED
from gdrprobe.report.check_text import render_rails
from gdrprobe.report.model import BenchReport, BenchRow, to_json
from gdrprobe.report.text import RULE, answer_and_causes, rate

CSV_FIELDS = tuple(field.name for field in dataclasses.fields(BenchRow))
PLOT_FIX = extra_fix("plot")
PROMETHEUS_FIX = extra_fix("prometheus")
LATENCY_PERCENTILES = ("min", "median", "p99", "p999", "max")
PLOT_FILES = ("bandwidth.png", "matrix.png", "latency.png")   # what --plot DIR writes
# An earlier sweep's JSON document, at most (a sweep of 8 GPUs, 8 NICs and 20 sizes, both
# memory kinds and 3 QP counts is about 8 MB).
MAX_BASELINE_BYTES = 64 << 20


# ---- text ---------------------------------------------------------------------------------


BANDWIDTH_HEADER = (f" {'GPU':<13} {'NIC':<9} {'memory':<8} {'QPs':>3} {'size[B]':>9}"
                    f" {'Gb/s':>10} {'Mpps':>9} {'GPU/host':>8} {'line rate':>9}  outcome")
LATENCY_HEADER = (f" {'NIC':<9} {'size[B]':>9} {'min[us]':>9} {'median[us]':>10}"
                  f" {'p99[us]':>9} {'p99.9[us]':>10} {'max[us]':>9}  outcome")


class BenchTable:
    """The sweep's table a row at a time, in the order the rows are measured (so a command
    can print each as it comes): a header wherever the mode changes, and a failure's cause
    and fix only where they first appear."""

    def __init__(self):
        self.mode: str | None = None
        self.said: set[str] = set()

    def lines(self, row: BenchRow) -> list[str]:
        lines = []
        if row.mode != self.mode:
            self.mode = row.mode
            lines.append(BANDWIDTH_HEADER if row.mode == "bandwidth" else LATENCY_HEADER)
        outcome = self._outcome(row)
        if row.mode == "bandwidth":
            lines.append(f" {row.gpu or '-':<13} {row.nic:<9} {row.memory:<8} {row.qps:>3}"
                         f" {row.size_bytes:>9} {_number(row.bandwidth_avg_gbps):>10}"
                         f" {_number(row.message_rate_mpps):>9}"
                         f" {_fraction(row.gpu_host_ratio):>8}"
                         f" {_percent(row.line_rate_fraction):>9}  {outcome}"
                         + _both_ways(row))
        else:
            lines.append(f" {row.nic:<9} {row.size_bytes:>9} {_number(row.latency_us_min):>9}"
                         f" {_number(row.latency_us_median):>10}"
                         f" {_number(row.latency_us_p99):>9} {_number(row.latency_us_p999):>10}"
                         f" {_number(row.latency_us_max):>9}  {outcome}")
        return lines

    def _outcome(self, row: BenchRow) -> str:
        if not row.detail or row.detail in self.said:
            return row.outcome
        self.said.add(row.detail)
        cause = (row.detail if row.detail.startswith(row.outcome)
                 else f"{row.outcome}: {row.detail}")
        return cause + (f"\n{'':>16}fix: {row.fix}" if row.fix else "")


def _both_ways(row: BenchRow) -> str:
    """A bidirectional row's other direction and the sum, Gb/s, or its NCCL pattern ("" for
    neither)."""
    if row.nccl_gbps is not None:
        return (f"  (NCCL pattern {_number(row.nccl_gbps)} Gb/s, ceiling "
                f"{_number(row.nccl_ceiling_gbps)} per connection: {row.nccl_answer})")
    if row.bidir_sum_gbps is None:
        return ""
    return (f"  (-b: reverse {_number(row.reverse_gbps)}, sum "
            f"{_number(row.bidir_sum_gbps)} Gb/s)")


def render_bench(report: BenchReport) -> str:
    """The whole sweep: the rows as :class:`BenchTable` prints them, then the summary."""
    table = BenchTable()
    lines = [RULE] + [line for row in report.rows for line in table.lines(row)]
    return "\n".join(lines) + "\n" + render_bench_summary(report)


def render_bench_summary(report: BenchReport) -> str:
    """What follows the rows: how many and how long, each pair's verdict, the baseline."""
    lines = [RULE, f" gdrprobe bench on {report.environment.hostname}: {len(report.rows)} rows"
             f" in {report.wall_s:.1f} s ({report.measured_s:.1f} s measuring)"
             + ("; INTERRUPTED, the rows measured until then" if report.interrupted else "")]
    lines += render_pairs(report) + render_baseline(report)
    if report.rails is not None:
        lines += [RULE] + render_rails(report.rails)
    return "\n".join(lines + [RULE])


def render_pairs(report: BenchReport) -> list[str]:
    lines = []
    for pair in (p for p in report.pairs if p.verdict is not None):
        v = pair.verdict
        ratio = f", GPU/host {v.ratio:.2f}" if v.ratio is not None else ""
        via = f" via {v.mechanism}" if v.mechanism else ""
        answer, causes = answer_and_causes(f"{v.classification}{via}{ratio}",
                                           v.classification, v.likely_causes[:1])
        if causes:
            answer = f"{answer}: {causes[0]}"
        lines.append(f" GPU {pair.gpu} - {pair.nic}: {answer}  (NIC: {pair.nic_reason})")
    return [RULE] + lines if lines else []


def render_baseline(report: BenchReport) -> list[str]:
    base = report.baseline
    if base is None:
        return []
    lines = [RULE, f" baseline {base.source}: {base.compared} rows compared, "
                   f"{len(base.changes)} fell by more than {base.max_drop:.0%}"]
    lines += [f"   {c.row.mode} {c.row.gpu or '-'} {c.row.nic} {c.row.memory} {c.row.qps} QP "
              f"{c.row.size_bytes} B: {c.reason}" for c in base.changes]
    return lines


def _number(value: float | None) -> str:
    return "-" if value is None else rate(value)


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


# ---- files ---------------------------------------------------------------------------------


def check_output_file(path: str, flag: str) -> None:
    """Refuse, before anything is measured, a file the sweep could not write when it ends
    (:func:`gdrprobe.files.check_output_path`: only where a regular file or nothing stands)."""
    check_output_path(path, flag)


def check_output_directory(path: str, flag: str) -> None:
    """Refuse, before anything is measured, a directory the sweep could not write its files
    into: one that is not a directory (a link to one is followed), one that does not exist
    and whose parent does not either, or one where a plot's file is anything but a regular
    file or nothing."""
    if not os.path.lexists(path):
        check_output_path(path, flag)
        return
    if not os.path.isdir(path):
        raise UsageError(f"{flag} {path} is not a directory; nothing was measured",
                         f"give {flag} a directory, or the name of one to create")
    for name in PLOT_FILES:
        check_output_path(os.path.join(path, name), flag)


def write_json(report: BenchReport, path: str) -> None:
    replace_file(path, (to_json(report) + "\n").encode(), "--output")


def write_csv(report: BenchReport, path: str) -> None:
    """One line per row; bandwidth and latency rows share the header, empty where a field
    does not apply."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for row in report.rows:
        writer.writerow({name: "" if value is None else value
                         for name, value in dataclasses.asdict(row).items()})
    replace_file(path, text.getvalue().encode(), "--csv")


BASELINE_FIX = "pass a JSON file written by 'gdrprobe bench --output FILE'"


def read_baseline(path: str) -> list[dict]:
    """The rows of an earlier ``gdrprobe bench`` JSON document: a regular file of at most
    MAX_BASELINE_BYTES, nested at most gdrprobe.files.MAX_JSON_DEPTH deep."""
    try:
        document = parse_json(read_bounded(path, MAX_BASELINE_BYTES))
    except NotRegularFile as error:
        raise UsageError(f"cannot read baseline {path}: it is {error.kind}, not a regular file",
                         BASELINE_FIX) from None
    except OSError as error:
        raise UsageError(f"cannot read baseline {path}: {error.strerror or error}",
                         BASELINE_FIX) from None
    except ValueError as error:       # not JSON, not UTF-8, too large or too deep
        raise UsageError(f"cannot read baseline {path}: {error}", BASELINE_FIX) from None
    if not isinstance(document, dict) or document.get("kind") != "bench" or \
            not isinstance(document.get("rows"), list):
        raise UsageError(f"{path} is not a gdrprobe bench document", BASELINE_FIX)
    return [row for row in document["rows"] if isinstance(row, dict)]


# ---- Prometheus ----------------------------------------------------------------------------


def require_prometheus() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError as error:
        raise MissingDependency(f"--prometheus needs prometheus_client ({error})",
                                PROMETHEUS_FIX) from error


PAIR_LABELS = ("gpu", "nic")
ROW_LABELS = ("gpu", "nic", "memory", "qps", "size_bytes")
# Prometheus' naming guide (prometheus.io/docs/practices/naming, "Base units"): base units in
# the name, bytes even where bits are the habit, and a ratio (0 to 1) where a percent or a
# fraction would be said; so a row's Gb/s (10^9 bit/s) is written as bytes per second.
ROW_METRICS = (   # (the row's field, the metric, its help): one name per value, bench or check
    ("bandwidth_avg_gbps", "gdrprobe_bandwidth_bytes_per_second",
     "RDMA WRITE average bandwidth, bytes per second"),
    ("gpu_host_ratio", "gdrprobe_gpu_host_ratio", "GPU memory bandwidth over host memory "
     "bandwidth, same NIC, QPs and size"),
    ("line_rate_fraction", "gdrprobe_line_rate_ratio", "average bandwidth over the port's "
     "line rate (speed x width)"),
)
BYTES_PER_SECOND_PER_GBPS = 1e9 / 8


def in_base_units(field: str, value: float) -> float:
    """A row's value as its metric carries it (ROW_METRICS): Gb/s as bytes per second."""
    return value * BYTES_PER_SECOND_PER_GBPS if field.endswith("_gbps") else value


def engaged_gauge(registry, extra_labels: tuple[str, ...] = ()):
    """gdrprobe_gdr_engaged per GPU-NIC pair (and extra_labels: the check's node)."""
    from prometheus_client import Gauge

    return Gauge("gdrprobe_gdr_engaged", "1 when GPUDirect RDMA is engaged on the pair "
                 "(GPU/host ratio at the largest size at least the threshold), else 0",
                 [*PAIR_LABELS, *extra_labels], registry=registry)


def row_gauges(registry, extra_labels: tuple[str, ...] = ()) -> dict:
    """The measured values' gauges, keyed by the field of :class:`BenchRow` each carries."""
    from prometheus_client import Gauge

    return {field: Gauge(name, text, [*ROW_LABELS, *extra_labels], registry=registry)
            for field, name, text in ROW_METRICS}


def prometheus_registry(report: BenchReport):
    """The node-exporter text-file metrics: GDR engaged per pair, and per measured
    bandwidth row its bandwidth (bytes per second), GPU/host ratio and line-rate ratio."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    engaged = engaged_gauge(registry)
    for pair in (p for p in report.pairs if p.verdict is not None):
        engaged.labels(pair.gpu, pair.nic).set(int(pair.verdict.classification == ENGAGED))
    gauges = row_gauges(registry)
    for row in report.rows:
        if row.mode != "bandwidth" or row.outcome != "measured":
            continue
        values = (row.gpu, row.nic, row.memory, str(row.qps), str(row.size_bytes))
        for field, gauge in gauges.items():
            value = getattr(row, field)
            if value is not None:
                gauge.labels(*values).set(in_base_units(field, value))
    Gauge("gdrprobe_bench_timestamp_seconds", "when the sweep ended (Unix time)",
          registry=registry).set_to_current_time()
    return registry


def write_prometheus(report: BenchReport, path: str) -> None:
    write_registry(prometheus_registry(report), path)


def write_registry(registry, path: str) -> None:
    """Written atomically (a temporary file in the same directory, renamed), as
    node_exporter's text-file collector requires, and only where a regular file or nothing
    stands (gdrprobe.files.replace_file)."""
    from prometheus_client import generate_latest

    replace_file(path, generate_latest(registry), "--prometheus")


# ---- plots: data first, then figures drawn from it -----------------------------------------


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise MissingDependency(f"--plot needs matplotlib ({error})", PLOT_FIX) from error


def bandwidth_series(report: BenchReport) -> dict[str, list[tuple[int, float]]]:
    """One line per memory kind (and GPU, NIC, QPs): (size, Gb/s) of its measured rows."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in report.rows:
        if row.mode == "bandwidth" and row.outcome == "measured":
            label = f"{row.memory} {row.gpu + ' ' if row.gpu else ''}{row.nic} {row.qps} QP"
            series[label].append((row.size_bytes, row.bandwidth_avg_gbps))
    return {label: sorted(points) for label, points in series.items()}


def matrix_data(report: BenchReport) -> tuple[list[str], list[str], list[list[float]]]:
    """GPUs (rows) x NICs (columns): the pair verdict's GPU/host ratio (NaN: not measured)."""
    gpus = list(dict.fromkeys(p.gpu for p in report.pairs if p.verdict is not None))
    nics = list(dict.fromkeys(p.nic for p in report.pairs if p.verdict is not None))
    values = [[math.nan] * len(nics) for _ in gpus]
    for pair in (p for p in report.pairs if p.verdict is not None):
        if pair.verdict.ratio is not None:
            values[gpus.index(pair.gpu)][nics.index(pair.nic)] = pair.verdict.ratio
    return gpus, nics, values


def latency_series(report: BenchReport) -> dict[str, list[tuple[int, float]]]:
    """Per NIC and percentile: (size, microseconds) of the measured latency rows."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in report.rows:
        if row.mode == "latency" and row.outcome == "measured":
            for name in LATENCY_PERCENTILES:
                series[f"{row.nic} {name}"].append((row.size_bytes,
                                                    getattr(row, f"latency_us_{name}")))
    return {label: sorted(points) for label, points in series.items()}


def _figure(title: str, xlabel: str, ylabel: str):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5.5), layout="constrained")
    axes = figure.add_subplot()
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return figure, axes


def draw_lines(series: dict[str, list[tuple[int, float]]], title: str, ylabel: str):
    figure, axes = _figure(title, "message size [B]", ylabel)
    for label, points in series.items():
        axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    axes.set_xscale("log", base=2)
    if series:
        axes.legend(fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    return figure


def draw_matrix(gpus: list[str], nics: list[str], values: list[list[float]]):
    figure, axes = _figure("GPU/host bandwidth ratio per GPU x NIC (largest size)", "NIC", "GPU")
    image = axes.imshow(values, vmin=0, vmax=1.1, cmap="RdYlGn", aspect="auto")
    axes.set_xticks(range(len(nics)), nics)
    axes.set_yticks(range(len(gpus)), gpus)
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            axes.text(j, i, "-" if math.isnan(value) else f"{value:.2f}", ha="center",
                      va="center")
    figure.colorbar(image, ax=axes)
    return figure


def figures(report: BenchReport) -> dict[str, object]:
    """The PNGs a sweep can draw, by file name."""
    drawn = {}
    bandwidth = bandwidth_series(report)
    if bandwidth:
        drawn[PLOT_FILES[0]] = draw_lines(bandwidth, "RDMA WRITE bandwidth by memory kind",
                                            "average bandwidth [Gb/s]")
    gpus, nics, values = matrix_data(report)
    if gpus and nics:
        drawn[PLOT_FILES[1]] = draw_matrix(gpus, nics, values)
    latency = latency_series(report)
    if latency:
        drawn[PLOT_FILES[2]] = draw_lines(latency, "RDMA WRITE one-way latency (host memory)",
                                          "latency [us]")
    return drawn


def write_plots(report: BenchReport, directory: str) -> list[str]:
    """Each figure as a PNG in directory (created); returns the paths written."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise unwritable(directory, error) from error
    paths = []
    for name, figure in figures(report).items():
        path = os.path.join(directory, name)
        image = io.BytesIO()
        figure.savefig(image, format="png", dpi=100)
        replace_file(path, image.getvalue(), "--plot")
        paths.append(path)
    return paths
