"""The doctor on the lab guest: a real rxe device, no GPU."""

import json

from tests.lab.helpers import gdrprobe


def findings_by_id(report: dict) -> dict:
    return {f["id"]: f for f in report["findings"]}


def test_doctor_sees_rxe_and_no_gpu():
    found = findings_by_id(doctor_json())
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


def doctor_json(*args: str) -> dict:
    """The doctor's report; exit 1 only says a check failed (the guest's 8 MiB memlock for
    jobs without CAP_IPC_LOCK does)."""
    done = gdrprobe("doctor", *args, "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_capture_replays_to_the_same_findings(tmp_path):
    live = doctor_json()
    gdrprobe("capture", str(tmp_path / "node"), check=True)
    replay = doctor_json("--root", str(tmp_path / "node"))
    assert findings_of(replay) == findings_of(live)


def findings_of(report: dict) -> list[tuple]:
    return [(f["id"], f["status"], f["summary"]) for f in report["findings"]]
