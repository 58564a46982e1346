"""The operators' files in deploy/ run for real (issue 22): ``check --prometheus`` writes
bench's metric names with the node, exit code and time stamp; a real node_exporter serves
the file and a real Prometheus scrapes it; the alert rules pass ``promtool``; every
Kubernetes manifest validates against the Kubernetes schemas; node-problem-detector's plugin
keeps NPD's contract for every exit code of the one table. Each real program is skipped,
with the reason, where it is not installed (./dev setup installs them)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from gdrprobe.cli import main
from gdrprobe.errors import DRAIN, EXIT_CODES, SCHEDULER_ACTION, START, NoDevice
from gdrprobe.report import write_check_prometheus
from gdrprobe.report.check import NodeCheckReport, NodeGpuCheck
from tests.unit.test_check_cli import api, engaged_report  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PLUGIN = DEPLOY / "npd" / "gdrprobe-npd-plugin"
RULES = DEPLOY / "prometheus" / "gdrprobe-rules.yml"
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
    arm = ('gdrprobe_gpu_host_ratio{gpu="0000:3b:00.0",memory="dmabuf",nic="rxe0",node="n1",'
           'qps="1",size_bytes="8388608"}')
    assert found[arm] == "0.97"
    assert abs(float(found['gdrprobe_check_timestamp_seconds{node="n1"}']) - time.time()) < 60
    assert [p.name for p in tmp_path.iterdir()] == ["gdrprobe.prom"]   # no temporary left


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
    from tests.unit.test_check_cli import inconclusive_report

    report = NodeCheckReport((NodeGpuCheck("0000:3b:00.0", "rxe0", 12,
                                           report=inconclusive_report()),), 30.0, 4.0, 12)
    path = tmp_path / "node.prom"
    write_check_prometheus(report, str(path), node="n1")
    found = samples(path.read_text())
    assert found['gdrprobe_check_exit_code{gpu="0000:3b:00.0",nic="rxe0",node="n1"}'] == "12.0"
    assert not [name for name in found if "engaged" in name]    # no alert on a guess
    assert [name for name in found if name.startswith("gdrprobe_gpu_host_ratio{")]


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
    result = wait_for_series(f"http://127.0.0.1:{prometheus_port}/api/v1/query?query={query}",
                             time.monotonic() + SCRAPE_DEADLINE_S)
    assert [(r["metric"]["gpu"], r["metric"]["nic"], r["value"][1]) for r in result] == \
        [("0000:3b:00.0", "rxe0", "1")]


# ---- Kubernetes --------------------------------------------------------------------------


def validate(document: dict) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate",
                                              reason="pip install 'gdrprobe[test]'")
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda path: path.name)
def test_every_manifest_validates_against_the_kubernetes_schemas(manifest):
    yaml = pytest.importorskip("yaml")
    documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert documents
    for document in documents:
        validate(document)


def test_the_validator_refuses_a_broken_manifest():
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load((DEPLOY / "kubernetes" / "gate-init-container.yaml").read_text())
    job["spec"]["template"]["spec"]["initContainers"][0]["comand"] = ["gdrprobe"]
    with pytest.raises(Exception, match="comand"):
        validate(job)


def test_the_npd_config_runs_the_shipped_plugin_for_its_condition():
    config = json.loads((DEPLOY / "npd" / "gdrprobe-monitor.json").read_text())
    assert config["plugin"] == "custom"
    [rule] = config["rules"]
    assert Path(rule["path"]).name == PLUGIN.name
    assert rule["condition"] in {c["type"] for c in config["conditions"]}
    assert "--prometheus" in rule["args"]


# ---- the plugin's contract ---------------------------------------------------------------

NPD = {START: 0, DRAIN: 1}


def run_plugin(tmp_path: Path, code: int, message: str = "") -> subprocess.CompletedProcess:
    fake = tmp_path / "gdrprobe"
    fake.write_text(f"#!/bin/sh\necho '{message}' >&2\necho \"$@\" > {tmp_path}/args\n"
                    f"exit {code}\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(PLUGIN), "--time-budget", "60"], env=env,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("row", EXIT_CODES, ids=lambda row: str(int(row.code)))
def test_the_plugin_maps_every_exit_code_onto_npd_0_1_2_with_one_short_line(tmp_path, row):
    done = run_plugin(tmp_path, int(row.code), "gdrprobe check: GPU 0 via mlx5_0: " + "x" * 200)
    assert done.returncode == NPD.get(SCHEDULER_ACTION[int(row.code)], 2)
    assert len(done.stdout.splitlines()) == 1 and len(done.stdout.strip()) <= 80
    assert (tmp_path / "args").read_text().split() == ["check", "--node", "--quiet",
                                                       "--time-budget", "60"]


def test_the_plugin_says_unknown_for_a_code_outside_the_table_and_names_it(tmp_path):
    done = run_plugin(tmp_path, 127, "gdrprobe: not found")
    assert (done.returncode, done.stdout.strip()) == \
        (2, "exit 127 (unknown code): gdrprobe: not found")
