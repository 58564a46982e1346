"""./dev demo-nccl-pattern's set-up (issue 40): its delayed wire is round-trip bound by
construction, and a report with a message unchecked fails the demo. (The demo itself runs in
the lab: lab/nccl_pattern.py, from lab/suites.py.)"""

from __future__ import annotations

import pathlib

from lab import nccl_pattern, suites


def test_the_delayed_wire_puts_ncclS_ceiling_under_half_the_wires_rate():
    wire_bps = nccl_pattern.RAIL_MBIT * 1e6
    step_bits = nccl_pattern.P2P * 8
    # a step alone holds at least its bytes on the wire and a round trip
    fastest_step_s = step_bits / wire_bps + 2 * nccl_pattern.DELAY_US * 1e-6
    ceiling_bps = 8 * step_bits / fastest_step_s
    assert ceiling_bps <= 0.5 * wire_bps
    # and the stream's queue (a pass of -n messages) outlasts the round trip many times
    messages = int(nccl_pattern.DELAYED_ARGS[nccl_pattern.DELAYED_ARGS.index("-n") + 1])
    assert messages * step_bits / wire_bps >= 5 * 2 * nccl_pattern.DELAY_US * 1e-6


def test_a_message_unchecked_in_either_arm_fails_the_demo():
    checked = {"messages_checked": 8, "messages_total": 8, "bad_bytes": 0, "stray_bytes": 0}
    report = {"bandwidth": [{"integrity": checked}], "nccl": [{"integrity": checked}]}
    assert nccl_pattern.every_step_checked(report)
    report["nccl"] = [{"integrity": {**checked, "messages_checked": 7}}]
    assert not nccl_pattern.every_step_checked(report)
    assert not nccl_pattern.every_step_checked({"bandwidth": [], "nccl": []})


def test_dev_test_runs_the_demo_and_the_lab_knows_it():
    dev = (pathlib.Path(__file__).parents[2] / "dev").read_text()
    test_line = next(line for line in dev.splitlines() if line.strip().startswith("test)"))
    assert "-m lab demo-nccl-pattern" in test_line
    assert suites.DEMO_NCCL_PATTERN_TIMEOUT_S <= 1200
