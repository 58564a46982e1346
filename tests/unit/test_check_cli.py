"""``gdrprobe check`` as a prolog script meets it: -q N is QPs, a bare -q still means quiet,
--node and --floor reach the API; and the verdict screen (issue 24: the NIC named, "not
testable" explained, a software device said plainly, nothing printed twice, the GPU arm's
inline size, verdict.arms in the JSON). The API is replaced by recorders."""

from __future__ import annotations

import json

import pytest

import gdrprobe
from gdrprobe.cli import main
from gdrprobe.report.check import NodeCheckReport
from gdrprobe.report.check_text import render_check
from gdrprobe.report.model import to_json
from tests.unit.fakes.reports import REASON, engaged_report, inconclusive_report, not_testable_report
@pytest.mark.parametrize("argv, qps, quiet_note", [
    (["check", "-q", "4"], 4, False),
    (["check", "--qp", "8"], 8, False),
    (["check", "-q"], None, True),        # an old prolog's quiet flag
    (["check", "--quiet"], None, False),
])
def test_q_n_is_qps_and_a_bare_q_still_means_quiet(api, capsys, argv, qps, quiet_note):
    assert main(argv) == 0
    assert api[-1][1]["qps"] == qps
    out, err = capsys.readouterr()
    quiet = qps is None
    assert (out == "") == quiet
    assert ("a bare -q means --quiet" in err) == quiet_note


def test_a_bare_q_with_json_is_refused(api, capsys):
    assert main(["check", "-q", "--json"]) == 2
    assert "choose one: --json, or --quiet" in capsys.readouterr().err


def test_floor_and_node_reach_the_api(api, capsys):
    assert main(["check", "--node", "--floor", "0.5", "--quiet"]) == 9
    name, kwargs = api[-1]
    assert name == "check_node" and kwargs["floor"] == 0.5
    assert "gdrprobe check: GPU 0000:3b:00.0 via rxe0: not testable" in capsys.readouterr().err
    assert main(["check", "--node", "-d", "mlx5_0"]) == 2


def test_node_takes_the_jobs_gpus_from_gpu(api):
    """issue 28: --gpu with --node names the job's GPUs (it was refused)."""
    assert main(["check", "--node", "--gpu", "0,GPU-8932f937", "--quiet"]) == 9
    name, kwargs = api[-1]
    assert name == "check_node" and kwargs["gpus"] == "0,GPU-8932f937"


def test_the_screen_names_the_nic_and_says_a_software_device_never_does_gpudirect():
    text = render_check(engaged_report())
    assert " NIC rxe0: no NIC decision: the first RDMA device" in text
    assert "rxe0 is a software RDMA device (rxe, siw): the CPU copies every byte, so it can " \
           "never do GPUDirect RDMA" in text
    assert "line rate of rxe0 port 1: 10 Gb/s; floor: not applied (software device)" in text
    assert "inline: host arm 0 B, GPU arms 0 B" in text
    assert " NIC lock: /run/gdrprobe/rxe0.lock" in text


def test_not_testable_is_explained_and_the_internals_are_printed_once():
    text = render_check(not_testable_report())
    assert "GPUDirect RDMA: NOT TESTABLE" in text
    assert ("not testable: the check could not measure GPUDirect RDMA here, so it says "
            "nothing for or against this node") in text
    assert text.count(REASON) == 1


def test_the_json_verdict_lists_its_arms_and_names_the_nic():
    document = json.loads(to_json(not_testable_report()))
    assert document["placement"]["nic"] == "rxe0"
    assert [(arm["direction"], arm["outcome"]) for arm in document["verdict"]["arms"]] == [
        ("both", "not testable")]
    assert document["floor"]["software_device"] is True
    assert document["arms"][1]["direction"] == "both"


# ---- inconclusive (issue 28) -------------------------------------------------------------


def test_require_raises_inconclusive_for_an_answer_the_measurement_cannot_tell(monkeypatch):
    from gdrprobe.errors import Inconclusive

    monkeypatch.setattr(gdrprobe, "check", lambda **kwargs: inconclusive_report())
    with pytest.raises(Inconclusive) as raised:
        gdrprobe.require(time_budget_s=20)
    assert raised.value.exit_code == 12
    assert raised.value.cause.startswith("GPUDirect RDMA is engaged, inconclusive (GPU/host "
                                         "0.97): inconclusive: the per-repeat GPU/host ratios")


def test_the_quiet_line_and_the_screen_say_inconclusive_and_warn(api, monkeypatch, capsys):
    monkeypatch.setattr(gdrprobe, "check", lambda **kwargs: inconclusive_report())
    assert main(["check", "--quiet"]) == 12
    assert capsys.readouterr().err.startswith(
        "gdrprobe check: GPUDirect RDMA engaged, inconclusive on GPU 0000:3b:00.0 via rxe0 "
        "(exit 12: warn): inconclusive: the per-repeat GPU/host ratios 0.80..0.97")
    text = render_check(inconclusive_report())
    assert "inconclusive: the measurement cannot tell whether GPUDirect RDMA is engaged" in text


def test_a_node_check_with_nothing_to_check_says_so_quietly(api, monkeypatch, capsys):
    empty = NodeCheckReport((), 30.0, 0.5, 9,
                            job_gpus="NVIDIA_VISIBLE_DEVICES=void: the job has no GPU on this node")
    monkeypatch.setattr(gdrprobe, "check_node", lambda **kwargs: empty)
    assert main(["check", "--node", "--quiet"]) == 9
    assert capsys.readouterr().err == (
        "gdrprobe check: nothing to check: NVIDIA_VISIBLE_DEVICES=void: the job has no GPU on "
        "this node (exit 9: warn)\n")
