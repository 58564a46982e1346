"""`check --node --all-rails` on the rails guest (lab/rails.py): two Soft-RoCE rails under one
PCIe switch with two stand-in GPUs, each rail shaped to a line rate by the lab's rxe. The
reports are the ones `python -m lab.rails guest` just printed (kept under REPORTS), so the
demo and these tests share one measurement per case.

Uncapped, the rails run together at their solo rate; capped, one uplink both pass carries
one rail's worth: both contend, the switch they share is named, the aggregate is the cap.
Emulation, not hardware proof (docs/lab.md#all-rails-at-once).
"""

import json
import os

import pytest

from gdrprobe import defaults
from lab import rails

pytestmark = pytest.mark.skipif(rails.REPORTS not in os.environ,
                                reason="runs in the rails guest (python -m lab demo-rails)")

CAP_GBPS = rails.UPLINK_MBIT / 1000
# The shaper counts each packet's headers too (about 2 % of a 4096-byte payload), and a
# window opens with up to 64 packets per QP already held (about 7 % of a one-second window
# at half the cap): the aggregate lands near the cap, a little either side.
AGGREGATE_OF_CAP = (0.75, 1.15)
# The barrier releases the rails together; the emulated CPUs wake their threads within
# tens of milliseconds of each other, against windows of about a second.
SKEW_OF_WINDOW = 0.2


def kept(case: str) -> tuple[int, dict]:
    with open(os.path.join(os.environ[rails.REPORTS], f"{case}.json")) as handle:
        saved = json.load(handle)
    return saved["exit_code"], saved["report"]


def each_rail_engaged_alone(report: dict) -> None:
    by_nic = {gpu["nic"]: gpu for gpu in report["gpus"]}
    assert sorted(by_nic) == sorted(rails.rail_names()), report["gpus"]
    for gpu in by_nic.values():
        assert gpu["exit_code"] == 0, gpu


def started_together(rails_report: dict) -> None:
    """The start skew is reported and small against the windows it opens."""
    for overlap in (rails_report["overlap"], rails_report["host_overlap"]):
        assert overlap["fraction"] >= defaults.RAILS_MIN_OVERLAP, overlap
        assert 0 <= overlap["skew_s"] < SKEW_OF_WINDOW * overlap["shortest_s"], overlap


def test_the_doctor_names_the_switch_the_rails_share_in_its_matrix():
    with open(os.path.join(os.environ[rails.REPORTS], "doctor.json")) as handle:
        report = json.load(handle)
    shared = rails.finding(report, "topology.rails")
    assert shared["summary"] == f"the 2 rails share the PCIe switch {rails.SWITCH}", shared
    names = [f"GPU{index}-{nic}" for index, nic in enumerate(rails.rail_names())]
    assert shared["evidence"][0]["value"] == ", ".join(names), shared
    matrix = rails.finding(report, "topology.matrix")["evidence"][0]["value"]
    assert f"share: PCIe switch {rails.SWITCH}" in matrix, matrix


def test_uncapped_rails_keep_their_solo_rate_together():
    code, report = kept("uncapped")
    each_rail_engaged_alone(report)
    together = report["rails"]
    assert together["verdict"] == "together" and code == 0, together
    started_together(together)
    for rail in together["rails"]:
        assert rail["ratio"] >= defaults.RAIL_RATIO and not rail["contending"], rail
    assert together["shared"] is None


def test_capped_rails_contend_and_the_switch_they_share_is_named():
    code, report = kept("capped")
    each_rail_engaged_alone(report)
    together = report["rails"]
    assert together["verdict"] == "contention" and code == 13 == together["exit_code"], together
    started_together(together)
    assert all(rail["contending"] for rail in together["rails"]), together["rails"]
    shared = together["shared"]
    assert shared["kind"] == "PCIe switch", shared
    assert shared["description"] in together["detail"]
    low, high = AGGREGATE_OF_CAP
    assert low * CAP_GBPS <= together["aggregate_gbps"] <= high * CAP_GBPS, together
    assert together["aggregate_gbps"] < 0.75 * together["solo_sum_gbps"], together
