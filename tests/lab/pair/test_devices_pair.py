"""gdrprobe devices on both hosts of the two-host lab."""

import json
import sys

from tests.lab.helpers import gdrprobe_json


def roce_v2_addresses(report: dict) -> set[str]:
    return {g["ip_address"] for d in report["devices"] for p in d["ports"]
            for g in p["gids"] if g["type"] == "RoCE v2" and p["state"] == "ACTIVE"}


def test_devices_on_host_a():
    assert "10.77.0.1" in roce_v2_addresses(gdrprobe_json("devices"))


def test_devices_on_host_b(host_b):
    done = host_b.call("run", argv=[sys.executable, "-m", "gdrprobe", "devices", "--json"],
                       timeout=120)
    assert done["returncode"] == 0, done["output"]
    assert "10.77.0.2" in roce_v2_addresses(json.loads(done["output"]))
