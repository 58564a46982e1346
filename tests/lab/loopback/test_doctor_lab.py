"""The doctor on the lab guest: a real rxe device, no GPU."""

from tests.lab.helpers import gdrprobe, gdrprobe_json


def findings_by_id(report: dict) -> dict:
    return {f["id"]: f for f in report["findings"]}


def test_doctor_sees_rxe_and_no_gpu():
    done = gdrprobe("doctor", "--json")
    assert done.returncode in (0, 1)
    import json
    found = findings_by_id(json.loads(done.stdout))
    assert found["nic.devices"]["status"] == "ok"
    assert "rxe0" in str(found["topology.software_nic"]["evidence"])
    assert found["topology.devices"]["status"] == "warn"      # no NVIDIA GPU here
    assert found["gpu.cuda"]["status"] == "skip"
    assert "no CUDA driver" in found["gpu.cuda"]["summary"]


def test_doctor_human_output_starts_with_the_headline():
    done = gdrprobe("doctor")
    first = done.stdout.splitlines()[0]
    assert first.startswith("First blocker:") or first.startswith("No blocking failure")
    assert "== topology ==" in done.stdout


def test_capture_replays_to_the_same_findings(tmp_path):
    live = gdrprobe_json("doctor")
    gdrprobe("capture", str(tmp_path / "node"), check=True)
    replay = gdrprobe_json("doctor", "--root", str(tmp_path / "node"))
    strip = lambda report: [(f["id"], f["status"], f["summary"]) for f in report["findings"]]
    assert strip(replay) == strip(live)
