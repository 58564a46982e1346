"""The operators' files in deploy/ run for real (issue 22): ``check --prometheus`` writes
bench's metric names with the node, exit code and time stamp; a real node_exporter serves
the file and a real Prometheus scrapes it; the alert rules pass ``promtool``; every
Kubernetes manifest validates against the Kubernetes schemas; node-problem-detector's plugin
keeps NPD's contract for every exit code of the one table. Each real program is skipped,
with the reason, where it is not installed (./dev setup installs them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from gdrprobe import defaults
from gdrprobe.cli import main
from gdrprobe.errors import (CANNOT_CHECK_CODES, DRAIN, DRAIN_CODES, EXIT_CODES,
                             SCHEDULER_ACTION, START, WARN, ExitCode, NoDevice)
from gdrprobe.report import write_check_prometheus
from gdrprobe.report.check import NodeCheckReport, NodeGpuCheck
from gdrprobe.report.check_metrics import NODE_ENV
from tests.unit.fakes.reports import engaged_report

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PLUGIN = DEPLOY / "npd" / "gdrprobe-npd-plugin"
MONITOR = DEPLOY / "npd" / "gdrprobe-monitor.json"
RULES = DEPLOY / "prometheus" / "gdrprobe-rules.yml"
DAEMONSET = DEPLOY / "kubernetes" / "gdrprobe-npd-daemonset.yaml"
GATE = DEPLOY / "kubernetes" / "gate-init-container.yaml"
# Debian's prometheus-node-exporter reads text files here unless told otherwise (its
# --collector.textfile.directory default, /usr/share/doc/prometheus-node-exporter/README.textfile).
DEBIAN_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
SCRAPE_DEADLINE_S = 40


def samples(text: str) -> dict[str, str]:
    return {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
            for line in text.splitlines() if line and not line.startswith("#")}


# ---- the writer and the flag ---------------------------------------------------------------


def test_a_check_writes_bench_metric_names_with_node_exit_code_and_time_stamp(tmp_path):
    path = tmp_path / "gdrprobe.prom"
    write_check_prometheus(engaged_report(), str(path), node="n1")
    found = samples(path.read_text())
    pair = 'gpu="0000:3b:00.0",nic="rxe0",node="n1"'
    assert found[f"gdrprobe_gdr_engaged{{{pair}}}"] == "1.0"
    assert found[f"gdrprobe_check_exit_code{{{pair}}}"] == "0.0"
    arm = ('{gpu="0000:3b:00.0",memory="dmabuf",nic="rxe0",node="n1",'
           'qps="1",size_bytes="8388608"}')
    assert found["gdrprobe_gpu_host_ratio" + arm] == "0.97"
    assert abs(float(found['gdrprobe_check_timestamp_seconds{node="n1"}']) - time.time()) < 60
    assert [p.name for p in tmp_path.iterdir()] == ["gdrprobe.prom"]   # no temporary left


def test_the_metric_names_are_in_base_units_as_prometheus_names_them(tmp_path):
    """Prometheus' naming guide: bytes (not bits, not Gb/s) per second, a ratio (0 to 1)
    named _ratio, seconds; issue 29 found _gbps and _fraction."""
    path = tmp_path / "gdrprobe.prom"
    report = engaged_report()
    write_check_prometheus(report, str(path), node="n1")
    found = samples(path.read_text())
    arm = ('{gpu="0000:3b:00.0",memory="dmabuf",nic="rxe0",node="n1",'
           'qps="1",size_bytes="8388608"}')
    [measured] = [a for a in report.arms if a.arm == "dmabuf"]
    assert float(found["gdrprobe_bandwidth_bytes_per_second" + arm]) == \
        pytest.approx(statistics.median(measured.bandwidths_gbps) * 1e9 / 8)
    assert float(found["gdrprobe_line_rate_ratio" + arm]) == \
        pytest.approx(measured.line_rate_fraction)
    names = {name.split("{")[0] for name in found}
    assert not [name for name in names if name.endswith(("_gbps", "_fraction"))]
    unit = ("_bytes_per_second", "_ratio", "_seconds", "_engaged", "_exit_code")
    assert all(name.endswith(unit) for name in names), names


def test_the_node_label_is_the_node_s_name_where_the_pod_says_it(tmp_path, monkeypatch):
    """In a pod the host name is the pod's: the DaemonSet hands the node's name down
    (spec.nodeName) and the metrics carry it."""
    monkeypatch.setenv(NODE_ENV, "gpu-node-17")
    path = tmp_path / "gdrprobe.prom"
    write_check_prometheus(engaged_report(), str(path))
    found = samples(path.read_text())
    assert found['gdrprobe_check_exit_code{gpu="0000:3b:00.0",nic="rxe0",node="gpu-node-17"}'] \
        == "0.0"
    assert set(re.findall(r'node="([^"]*)"', path.read_text())) == {"gpu-node-17"}


def test_a_node_check_has_one_series_per_gpu_and_not_testable_says_nothing_of_gdr(tmp_path):
    report = NodeCheckReport((
        NodeGpuCheck("0000:3b:00.0", "mlx5_0", 0, report=engaged_report()),
        NodeGpuCheck("0000:5e:00.0", "mlx5_1", 9, error="not testable: no CUDA driver")),
        30.0, 4.0, 9)
    path = tmp_path / "node.prom"
    write_check_prometheus(report, str(path), node="n1")
    found = samples(path.read_text())
    assert found['gdrprobe_check_exit_code{gpu="0000:5e:00.0",nic="mlx5_1",node="n1"}'] == "9.0"
    assert found['gdrprobe_gdr_engaged{gpu="0000:3b:00.0",nic="mlx5_0",node="n1"}'] == "1.0"
    assert not [name for name in found if "0000:5e:00.0" in name and "engaged" in name]


def test_an_inconclusive_answer_writes_its_exit_code_and_arms_but_no_engaged_series(tmp_path):
    from tests.unit.fakes.reports import inconclusive_report
    report = NodeCheckReport((NodeGpuCheck("0000:3b:00.0", "rxe0", 12,
                                           report=inconclusive_report()),), 30.0, 4.0, 12)
    path = tmp_path / "node.prom"
    write_check_prometheus(report, str(path), node="n1")
    found = samples(path.read_text())
    assert found['gdrprobe_check_exit_code{gpu="0000:3b:00.0",nic="rxe0",node="n1"}'] == "12.0"
    assert not [name for name in found if "engaged" in name]    # no alert on a guess
    assert [name for name in found if name.startswith("gdrprobe_gpu_host_ratio{")]


def rails_report(verdict: str, ratios: tuple[float, float]):
    from gdrprobe.report.check import RailResult, RailsReport

    rails = tuple(RailResult(f"0000:{bus}:00.0", f"mlx5_{i}", 380.0, 380.0 * ratio, ratio,
                             contending=ratio < defaults.RAIL_RATIO)
                  for i, (bus, ratio) in enumerate(zip(("3b", "5e"), ratios)))
    return NodeCheckReport(tuple(NodeGpuCheck(rail.gpu, rail.nic, 0, report=engaged_report())
                                 for rail in rails), 60.0, 40.0, 13,
                           rails=RailsReport.of(verdict, rails))


def test_all_rails_write_each_rail_s_concurrent_ratio_and_the_node_s_aggregate(tmp_path):
    path = tmp_path / "node.prom"
    write_check_prometheus(rails_report("contention", (0.5, 0.25)), str(path), node="n1")
    found = samples(path.read_text())
    assert found['gdrprobe_rails_exit_code{node="n1"}'] == "13.0"
    assert found['gdrprobe_rail_concurrent_ratio{gpu="0000:3b:00.0",nic="mlx5_0",node="n1"}'] == "0.5"
    assert float(found['gdrprobe_rails_aggregate_bytes_per_second{node="n1"}']) == \
        pytest.approx(285.0 * 1e9 / 8)
    assert float(found['gdrprobe_rails_solo_sum_bytes_per_second{node="n1"}']) == \
        pytest.approx(760.0 * 1e9 / 8)


def test_inconclusive_rails_write_their_exit_code_and_no_ratio(tmp_path):
    path = tmp_path / "node.prom"
    write_check_prometheus(rails_report("inconclusive", (0.5, 0.25)), str(path), node="n1")
    found = samples(path.read_text())
    assert found['gdrprobe_rails_exit_code{node="n1"}'] == "12.0"
    assert not [name for name in found if name.startswith(("gdrprobe_rail_", "gdrprobe_rails_agg"))]


def test_check_prometheus_writes_the_file_and_an_error_writes_its_exit_code(
        api, tmp_path, monkeypatch, capsys):  # noqa: F811
    path = tmp_path / "check.prom"
    assert main(["check", "--quiet", "--prometheus", str(path)]) == 0
    assert "gdrprobe_gdr_engaged{" in path.read_text()

    def no_device(**kwargs):
        raise NoDevice("no RDMA device", "load the NIC driver")

    monkeypatch.setattr("gdrprobe.check", no_device)
    assert main(["check", "--quiet", "-d", "mlx5_9", "--prometheus", str(path)]) == 4
    assert samples(path.read_text())[
        f'gdrprobe_check_exit_code{{gpu="",nic="mlx5_9",node="{socket.gethostname()}"}}'] == "4.0"


def test_a_bug_in_the_check_writes_the_internal_error_not_the_last_checks_metrics(
        api, tmp_path, monkeypatch, capsys):  # noqa: F811
    path = tmp_path / "check.prom"
    assert main(["check", "--quiet", "--prometheus", str(path)]) == 0

    def bug(**kwargs):
        raise KeyError("slot")

    monkeypatch.setattr("gdrprobe.check", bug)
    assert main(["check", "--quiet", "--prometheus", str(path)]) == 70
    found = samples(path.read_text())
    assert found[f'gdrprobe_check_exit_code{{gpu="",nic="",node="{socket.gethostname()}"}}'] \
        == "70.0"
    assert not [name for name in found if "engaged" in name]


def test_an_unwritable_file_or_missing_prometheus_client_is_refused_before_measuring(
        api, tmp_path, monkeypatch, capsys):  # noqa: F811
    assert main(["check", "--prometheus", str(tmp_path / "no" / "such.prom")]) == 2
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert main(["check", "--prometheus", str(tmp_path / "x.prom")]) == 3
    assert "gdrprobe[prometheus]" in capsys.readouterr().err
    assert api == []                          # nothing was measured


# ---- the alert rules under promtool ----------------------------------------------------------


def needs(program: str) -> str:
    path = shutil.which(program) or (f"/usr/bin/{program}"
                                     if os.access(f"/usr/bin/{program}", os.X_OK) else None)
    if path is None:
        pytest.skip(f"{program} is not installed (./dev setup installs Debian's package)")
    return path


@pytest.mark.parametrize("command", [["check", "rules", RULES.name],
                                     ["test", "rules", "gdrprobe-rules.test.yml"]])
def test_the_alert_rules_pass_promtool(command):
    done = subprocess.run([needs("promtool"), *command], cwd=RULES.parent, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


# ---- a real node_exporter and a real Prometheus ----------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def wait_for_series(url: str, deadline: float) -> list:
    while time.monotonic() < deadline:
        try:
            result = get_json(url)["data"]["result"]
            if result:
                return result
        except OSError:
            pass                              # not listening yet
        time.sleep(0.5)
    return []


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_prometheus_scrapes_the_check_through_node_exporter(tmp_path, processes):
    exporter, prometheus = needs("prometheus-node-exporter"), needs("prometheus")
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    write_check_prometheus(engaged_report(), str(textfiles / "gdrprobe.prom"), node="n1")
    exporter_port, prometheus_port = free_port(), free_port()
    processes.append(subprocess.Popen(
        [exporter, f"--web.listen-address=127.0.0.1:{exporter_port}",
         "--collector.disable-defaults", "--collector.textfile",
         f"--collector.textfile.directory={textfiles}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      "scrape_configs:\n  - job_name: node\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{exporter_port}']\n")
    processes.append(subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    query = urllib.parse.quote('gdrprobe_gdr_engaged{node="n1"}')
    url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?query="
    result = wait_for_series(url + query, time.monotonic() + SCRAPE_DEADLINE_S)
    assert [(r["metric"]["gpu"], r["metric"]["nic"], r["value"][1]) for r in result] == \
        [("0000:3b:00.0", "rxe0", "1")]
    query = urllib.parse.quote('gdrprobe_bandwidth_bytes_per_second{node="n1",memory="dmabuf"}')
    [bandwidth] = wait_for_series(url + query, time.monotonic() + SCRAPE_DEADLINE_S)
    assert float(bandwidth["value"][1]) > 1e9          # bytes per second, not Gb/s


def test_the_textfile_directory_is_debians_node_exporter_default():
    """The path the DaemonSet mounts, the monitor writes and the docs name is the one
    Debian's prometheus-node-exporter reads without being told (its --help states it)."""
    exporter = needs("prometheus-node-exporter")
    done = subprocess.run([exporter, "--help"], capture_output=True, text=True, timeout=60)
    found = re.search(r'--collector\.textfile\.directory="([^"]+)"', done.stdout + done.stderr)
    assert found and found.group(1) == DEBIAN_TEXTFILE_DIR
    [rule] = [r for r in monitor()["rules"] if "--prometheus" in r["args"]]
    args = rule["args"]
    assert Path(args[args.index("--prometheus") + 1]).parent == Path(DEBIAN_TEXTFILE_DIR)
    assert DEBIAN_TEXTFILE_DIR in {v["hostPath"]["path"] for v in pod_spec(DAEMONSET)["volumes"]
                                   if "hostPath" in v}
    assert f"--prometheus {DEBIAN_TEXTFILE_DIR}/gdrprobe.prom" in \
        (ROOT / "docs" / "operations.md").read_text()


# ---- Kubernetes --------------------------------------------------------------------------


def validate(document: dict) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate",
                                              reason="pip install 'gdrprobe[test]'")
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def documents(manifest: Path) -> list[dict]:
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all(manifest.read_text()) if d]


def pod_spec(manifest: Path) -> dict:
    [workload] = [d for d in documents(manifest) if d["kind"] in ("DaemonSet", "Job")]
    return workload["spec"]["template"]["spec"]


def containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda path: path.name)
def test_every_manifest_validates_against_the_kubernetes_schemas(manifest):
    found = documents(manifest)
    assert found
    for document in found:
        validate(document)


def test_the_validator_refuses_a_broken_manifest():
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load(GATE.read_text())
    job["spec"]["template"]["spec"]["initContainers"][0]["comand"] = ["gdrprobe"]
    with pytest.raises(Exception, match="comand"):
        validate(job)


def test_the_npd_daemonset_claims_no_gpu_and_sees_them_through_the_runtime():
    """A pod that requests nvidia.com/gpu holds the node's GPUs as long as it runs: an
    8-GPU node would run no training pod (issue 29). A monitor sees the GPUs through the
    NVIDIA runtime, as NVIDIA's dcgm-exporter does."""
    spec = pod_spec(DAEMONSET)
    for container in containers(spec):
        resources = container.get("resources", {})
        asked = {**resources.get("limits", {}), **resources.get("requests", {})}
        assert not [name for name in asked if name.startswith("nvidia.com/")], container["name"]
    assert spec["runtimeClassName"] == "nvidia"
    [npd] = spec["containers"]
    env = {e["name"]: e for e in npd["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


def test_the_npd_daemonset_lands_on_tainted_gpu_nodes_and_is_not_evicted_for_jobs():
    spec = pod_spec(DAEMONSET)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"


def test_the_npd_daemonset_names_the_node_in_its_metrics():
    [npd] = pod_spec(DAEMONSET)["containers"]
    env = {e["name"]: e for e in npd["env"]}
    assert env[NODE_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"  # NPD's


@pytest.mark.parametrize("manifest", [DAEMONSET, GATE], ids=lambda path: path.name)
def test_every_pod_that_checks_shares_the_nodes_lock_directory(manifest):
    """docs/check.md: pods of one node coordinate their checks through a shared
    GDRPROBE_LOCK_DIR, a hostPath: the DaemonSet's check and the gates' never measure the
    same NIC at once."""
    from gdrprobe.campaign.nic_lock import LOCK_DIR_ENV

    spec = pod_spec(manifest)
    volumes = {v["name"]: v for v in spec["volumes"]}
    checking = [c for c in containers(spec) if "gdrprobe" in c["image"]]
    assert checking
    for container in checking:
        directory = {e["name"]: e.get("value") for e in container["env"]}[LOCK_DIR_ENV]
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
        assert volumes[mount["name"]]["hostPath"]["path"] == directory == defaults.LOCK_DIRS[0]


def gate_script() -> str:
    [gate] = pod_spec(GATE)["initContainers"]
    assert gate["command"][:2] == ["/bin/sh", "-c"]
    return gate["command"][2]


@pytest.mark.parametrize("code", [*[int(row.code) for row in EXIT_CODES], 127],
                         ids=lambda code: str(code))
def test_the_gate_fails_its_job_on_exactly_the_drain_codes(tmp_path, code):
    """The init container's script, run by sh against a gdrprobe that exits with each code
    of the one table (and 127, gdrprobe missing): the pod fails only where the table says
    drain; every warning (9, 10, 12, 70 ...) lets the trainer start and says so."""
    fake = tmp_path / "gdrprobe"
    fake.write_text(f"#!/bin/sh\nexit {code}\n")
    fake.chmod(0o755)
    done = subprocess.run(["/bin/sh", "-c", gate_script()], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    drains = SCHEDULER_ACTION.get(code) == DRAIN
    assert (done.returncode != 0) == drains
    if drains:
        assert done.returncode == code and "drain" in done.stderr
    elif code:
        assert f"exit {code}: warn" in done.stderr


# ---- node-problem-detector's configuration ---------------------------------------------------


def monitor() -> dict:
    return json.loads(MONITOR.read_text())


def seconds(duration: str) -> float:
    """A Go duration as NPD's config writes them (time.ParseDuration: 30m, 5m, 10s)."""
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(number) * units[unit]
               for number, unit in re.findall(r"(\d+(?:\.\d+)?)([hms])", duration))


def test_the_npd_config_runs_the_shipped_plugin_for_its_conditions():
    config = monitor()
    assert config["plugin"] == "custom"
    conditions = {c["type"]: c for c in config["conditions"]}
    for rule in config["rules"]:
        assert Path(rule["path"]).name == PLUGIN.name
        assert rule["condition"] in conditions
        assert seconds(rule["timeout"]) <= seconds(config["pluginConfig"]["timeout"])
    [check_rule] = [r for r in config["rules"] if "--npd-health" not in r["args"]]
    assert "--prometheus" in check_rule["args"]


def test_npd_posts_nothing_before_a_check_and_unknown_never_says_engaged():
    """skip_initial_status: a restarted NPD posts no default status before its first check.
    NPD gives an Unknown condition the default reason (custom_plugin_monitor.go
    generateStatus): that reason must not claim GPUDirect RDMA is engaged."""
    config = monitor()
    assert config["pluginConfig"]["skip_initial_status"] is True
    for condition in config["conditions"]:
        assert "Engaged" not in condition["reason"], condition
    reasons = [r["reason"] for r in config["rules"]]
    assert len(set(reasons)) == len(reasons)


def test_the_check_s_limits_nest_and_its_schedule_keeps_the_stale_alert_quiet():
    """The check's budget fits the plugin's own limit, which fits the rule's timeout (NPD
    kills the process group there); a check every interval keeps the time stamp younger
    than the stale alert's hour, and leaves the NIC to the jobs most of the time."""
    config = monitor()
    [rule] = [r for r in config["rules"] if "--npd-health" not in r["args"]]
    args = rule["args"]
    budget = float(args[args.index("--time-budget") + 1])
    limit = float(args[args.index("--npd-limit") + 1])
    timeout = seconds(rule["timeout"])
    assert budget < limit < timeout
    interval = seconds(config["pluginConfig"]["invoke_interval"])
    stale = float(re.search(r"gdrprobe_check_timestamp_seconds > (\d+)",
                            RULES.read_text()).group(1))
    assert interval >= 30 * 60 and interval + timeout < stale


# ---- the plugin's contract ---------------------------------------------------------------

NPD = {START: 0, DRAIN: 1}
NPD_UNKNOWN = 2


def run_plugin(tmp_path: Path, code: int | None, message: str = "", *extra: str,
               path: str | None = None, python: list | None = None,
               stdin=None) -> subprocess.CompletedProcess:
    """The plugin as NPD runs it, against a gdrprobe that prints message and exits with
    code (None: none on PATH)."""
    if code is not None:
        fake = tmp_path / "gdrprobe"
        fake.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\necho '{message}' >&2\n"
                        f"echo \"$@\" > {tmp_path}/args\nexit {code}\n")
        fake.chmod(0o755)
    env = dict(os.environ, PATH=path or f"{tmp_path}:/usr/bin:/bin", PYTHONPATH=str(ROOT))
    argv = ["--npd-state", str(tmp_path / "state.json"), *extra]
    return subprocess.run([*(python or [sys.executable, str(PLUGIN)]), *argv], env=env,
                          capture_output=True, text=True, timeout=60, stdin=stdin)


def health(tmp_path: Path) -> subprocess.CompletedProcess:
    return run_plugin(tmp_path, None, "", "--npd-health")


def assert_one_short_line(done: subprocess.CompletedProcess) -> None:
    assert len(done.stdout.splitlines()) == 1 and len(done.stdout.strip()) <= 80, done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("row", EXIT_CODES, ids=lambda row: str(int(row.code)))
def test_the_plugin_maps_every_exit_code_onto_npd_0_1_2_with_one_short_line(tmp_path, row):
    code = int(row.code)
    done = run_plugin(tmp_path, code, f"gdrprobe check: GPU 0 via mlx5_0: (exit {code}: x) "
                      + "x" * 200, "--time-budget", "60")
    assert done.returncode == NPD.get(row.action, NPD_UNKNOWN)
    assert_one_short_line(done)
    assert (tmp_path / "args").read_text().split() == ["check", "--node", "--quiet",
                                                       "--time-budget", "60"]
    if row.action == WARN:                  # a warning says which one
        assert done.stdout.startswith(f"exit {code} (warn: "
                                      f"{ExitCode(code).name.lower().replace('_', ' ')})")
    assert health(tmp_path).returncode == (1 if code in CANNOT_CHECK_CODES else 0)


def test_a_busy_nic_is_unknown_not_a_problem(tmp_path):
    """Exit 12 (another job's traffic on the NIC, the node not judged now): Unknown, saying
    so; the condition never turns True on a busy node."""
    done = run_plugin(tmp_path, 12, "gdrprobe check: GPU 0 via mlx5_0: inconclusive: traffic "
                      "of another job on mlx5_0 (exit 12: warn)")
    assert (done.returncode, done.stdout.split(":")[0]) == (2, "exit 12 (warn")
    assert "inconclusive" in done.stdout and health(tmp_path).returncode == 0


def test_the_line_is_the_one_of_the_gpu_that_decided(tmp_path):
    lines = ("gdrprobe check: GPU 0 via mlx5_0: not testable (exit 9: warn)\n"
             "gdrprobe check: GPU 1 via mlx5_1: degraded, GPU/host 0.41 (exit 1: drain)")
    done = run_plugin(tmp_path, 1, lines)
    assert done.returncode == 1 and done.stdout.startswith("exit 1 (drain): GPU 1 via mlx5_1")


def test_the_plugin_says_unknown_for_a_code_outside_the_table_and_names_it(tmp_path):
    done = run_plugin(tmp_path, 127, "gdrprobe: not found")
    assert (done.returncode, done.stdout.strip()) == \
        (2, "exit 127 (unknown code): gdrprobe: not found")
    assert (health(tmp_path).returncode, health(tmp_path).stdout.strip()) == \
        (1, "exit 127 (unknown code): gdrprobe: not found")


def test_gdrprobe_missing_is_unknown_and_the_health_condition_says_so(tmp_path):
    done = run_plugin(tmp_path, None, path="/nonexistent")
    assert done.returncode == 2 and done.stdout.startswith("cannot run gdrprobe")
    assert health(tmp_path).returncode == 1


def test_an_error_of_the_plugin_is_unknown_never_a_problem_and_never_a_traceback(tmp_path):
    """An uncaught exception would exit 1, which NPD reads as a problem (issue 29)."""
    done = run_plugin(tmp_path, 0, "", "--npd-limit", "soon")
    assert done.returncode == 2 and done.stdout.startswith("plugin error: ValueError")
    assert_one_short_line(done)
    assert health(tmp_path).returncode == 1


def test_a_stuck_check_is_stopped_at_the_plugins_limit_and_the_health_condition_says_so(
        tmp_path):
    fake = tmp_path / "gdrprobe"
    fake.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\nexec sleep 60\n")
    fake.chmod(0o755)
    done = run_plugin(tmp_path, None, "", "--npd-limit", "1")
    assert done.returncode == 2 and done.stdout.startswith("no answer in 1 s")
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert health(tmp_path).returncode == 1


def test_a_check_killed_at_npds_timeout_turns_the_health_condition_true(tmp_path):
    """NPD SIGKILLs the plugin's process group at the rule's timeout (exec_unix.go): the
    state the check left says it never finished."""
    (tmp_path / "state.json").write_text(json.dumps({"running": True, "note": ""}))
    done = health(tmp_path)
    assert done.returncode == 1 and "did not finish" in done.stdout


BLOCK_PROMETHEUS = """
import runpy, sys
sys.modules["prometheus_client"] = None       # importing it raises ImportError
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_without_prometheus_client_the_check_still_runs_and_the_health_condition_says_so(
        tmp_path):
    """gdrprobe refuses --prometheus without prometheus_client (exit 3): every check would
    be Unknown forever (issue 29). The plugin drops the flag, checks, and says why."""
    done = run_plugin(tmp_path, 0, "", "--prometheus", str(tmp_path / "g.prom"),
                      python=[sys.executable, "-c", BLOCK_PROMETHEUS, str(PLUGIN)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--prometheus" not in (tmp_path / "args").read_text()
    done = health(tmp_path)
    assert (done.returncode, done.stdout.strip()) == \
        (1, "metrics off: prometheus_client is not importable here")


def test_a_plugin_whose_reader_went_away_prints_no_traceback(tmp_path):
    fake = tmp_path / "gdrprobe"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    reader, writer = os.pipe()
    os.close(reader)                              # NPD stopped reading
    try:
        done = subprocess.run([sys.executable, str(PLUGIN), "--npd-state",
                               str(tmp_path / "state.json")], stdout=writer,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              env=dict(os.environ, PATH=f"{tmp_path}:/usr/bin:/bin",
                                       PYTHONPATH=str(ROOT)))
    finally:
        os.close(writer)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr


def test_the_docs_table_of_what_each_exit_does_is_the_one_table_s():
    """docs/operations.md says what each exit does in the gate, NPD and Prometheus; its rows
    name exactly the codes errors.py gives each action."""
    page = (ROOT / "docs" / "operations.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines()
            if line.startswith("| ") and "|" in line[2:]}

    def codes(prefix: str) -> set[int]:
        [cell] = [cell for cell in rows if cell.startswith(prefix)]
        return {int(code) for code in re.findall(r"\b(\d+)\b", cell.split(":", 1)[1])}

    assert codes("a drain code") == {int(c) for c in DRAIN_CODES}
    assert codes("the check cannot run") == {int(c) for c in CANNOT_CHECK_CODES}
    warnings = {int(row.code) for row in EXIT_CODES if row.action == WARN}
    assert codes("a warning that says nothing") | codes("engaged with a performance warning") == (
        warnings - {int(c) for c in CANNOT_CHECK_CODES})
    assert codes("engaged with a performance warning") == {int(ExitCode.PERFORMANCE_WARNING)}
