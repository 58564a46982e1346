"""The prolog's drain is a hard gate (issue 41 item 1): before it exits it ends the job
itself, while slurmctld still holds the job in its prolog wait, so that no srun or salloc
polling for the prolog's end can start a step on the node (docs/slurm.md, "A hard gate").
A batch job is requeued as slurmd would requeue it (held, unless SchedulerParameters has
nohold_on_prolog_fail); any other job, or one Slurm will not requeue, is cancelled."""

from __future__ import annotations

import shutil

import pytest

from gdrprobe.errors import DRAIN_CODES
from tests.unit.fakes.prolog import JOB, NOT_A_BATCH_JOB

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")


@pytest.mark.parametrize("code", DRAIN_CODES)
def test_a_batch_job_is_requeued_and_held_before_the_prolog_exits(node, code):
    done = node(int(code))
    assert done.returncode == 1
    assert node.drained()[:3] == ["update", "nodename=node17", "state=drain"]
    assert node.requeued() == [f"requeuehold {JOB}"] and node.cancelled() == []
    assert ", job 42: drain, the job is requeued and held: gdrprobe check:" in node.log()


def test_an_srun_or_salloc_job_which_slurm_cannot_requeue_is_cancelled(node):
    """The prolog exits 0 for a job it cancelled: slurmd's own kill of a failed prolog's
    job would find it ended and retry every 15 s until slurmctld purges the job."""
    done = node(1, FAKE_REQUEUE_CODE="1")
    assert done.returncode == 0
    assert node.drained()[:3] == ["update", "nodename=node17", "state=drain"]
    assert node.requeued() == [f"requeuehold {JOB}"] and node.cancelled() == [JOB]
    assert f"drain, the job is cancelled ({NOT_A_BATCH_JOB}): gdrprobe check:" in node.log()


def test_a_job_cancelled_on_a_node_scontrol_could_not_drain_still_fails_the_prolog(node):
    """Slurm's own drain ("Prolog error") is then the only one: the prolog fails."""
    done = node(1, FAKE_REQUEUE_CODE="1", FAKE_SCONTROL_CODE="1")
    assert done.returncode == 1 and node.cancelled() == [JOB]


def test_nohold_on_prolog_fail_requeues_without_a_hold_as_slurmd_would(node):
    (node.dir / "slurm.conf").write_text(
        "SchedulerParameters=bf_continue,nohold_on_prolog_fail\n")
    assert node(4).returncode == 1
    assert node.requeued() == [f"requeue {JOB}"]
    assert "drain, the job is requeued: " in node.log()


def test_a_job_slurmctld_cannot_be_told_about_is_left_to_slurm_and_said(node):
    done = node(1, FAKE_REQUEUE_CODE="1", FAKE_SCANCEL_CODE="1")
    assert done.returncode == 1
    assert "drain, the job is left to Slurm (scontrol requeuehold: " in node.log()


@pytest.mark.parametrize("case", ["stuck", "strict"])
def test_every_drain_ends_the_job(node, case):
    if case == "stuck":
        (node.bin / "gdrprobe").write_text("#!/bin/sh\nexec sleep 30\n")
        node.settings("GDRPROBE_PROLOG_TIMEOUT=1", "GDRPROBE_PROLOG_KILL_AFTER=1")
        code = 0
    else:
        node.settings("GDRPROBE_PROLOG_STRICT=1")
        code = 70
    assert node(code).returncode == 1
    assert node.requeued() == [f"requeuehold {JOB}"]


@pytest.mark.parametrize("code", [0, 9, 12, 13, 70])
def test_a_job_that_starts_is_never_touched(node, code):
    assert node(code).returncode == 0
    assert node.requeued() == [] and node.cancelled() == []


def test_the_health_check_has_no_job_to_end(node):
    from tests.unit.fakes.prolog import HEALTH_CHECK

    done = node(4, script=HEALTH_CHECK)
    assert done.returncode == 0
    assert node.reason().startswith("gdrprobe: exit 4:")
    assert node.requeued() == [] and node.cancelled() == []
