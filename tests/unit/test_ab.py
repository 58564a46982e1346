"""The A/B's bookkeeping: arms planned, repeats alternated, arm failures turned into
evidence, the verdict reached. run_once is the seam: here it returns recorded runs."""

import pytest

from gdrprobe.memory.spec import MemorySpec
from gdrprobe.campaign.ab import StopSampling, plan_arms, run_ab
from gdrprobe.errors import (CompletionError, CudaError, IntegrityError, MissingDependency,
                             NoDevice, NoRdmaDevice, NotTestable, RegistrationFailed)
from gdrprobe.protocol.messages import findings_from_message, findings_message
from gdrprobe.report.model import (Finding, RunReport, Status)
from tests.unit.fakes.runs import GPU, HOST, fake_probe, probe_by_mechanism, recorded_run

def test_plan_puts_host_first_and_staged_last():
    arms = plan_arms(GPU, HOST, with_staged=True)
    assert [a.name for a in arms] == ["host", "gpu", "staged"]
    assert arms[2].local.mechanism == "staged" and arms[2].remote == HOST
    remote_side = plan_arms(HOST, MemorySpec.from_choice("peermem"), with_staged=False)
    assert [(a.local.kind, a.remote.mechanism) for a in remote_side] == [
        ("host", "auto"), ("host", "peermem")]


def test_engaged_when_the_gpu_arm_keeps_up():
    run_once, calls = fake_probe(gpu_gbps=97.0)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=3)
    assert calls == ["host", "gpu"] * 3             # alternating, repeat by repeat
    assert report.verdict.classification == "engaged"
    assert report.verdict.mechanism == "dmabuf"
    assert report.verdict.ratio == pytest.approx(0.97)
    assert report.arms[1].arm == "dmabuf" and report.arms[1].mechanism_reason == "auto: both can"
    assert report.verdict.exit_code == 0


def test_degraded_when_it_does_not():
    run_once, _ = fake_probe(gpu_gbps=30.0, mechanism="peermem")
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=2)
    assert report.verdict.classification == "degraded"
    assert report.verdict.exit_code == 1


def test_no_cuda_driver_is_not_testable_and_the_arm_is_tried_once():
    error = NotTestable("not testable: no CUDA driver", "install the driver",
                        evidence="auto fell back to peermem: the NIC cannot register DMA-BUF")
    run_once, calls = fake_probe(gpu_error=error)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=3)
    assert calls == ["host", "gpu"]          # the verdict is known: no further host runs
    assert report.verdict.classification == "not testable"
    assert report.verdict.exit_code == 9
    gpu_arm = report.arms[1]
    assert gpu_arm.outcome == "not testable" and "no CUDA driver" in gpu_arm.detail
    assert "cannot register DMA-BUF" in gpu_arm.mechanism_reason
    assert report.arms[0].bandwidths_gbps == (100.0,) and report.repeats == 1


def test_refused_registration_is_not_engaged_with_the_cause():
    error = RegistrationFailed("registering GPU memory through peermem failed", "modprobe",
                               error_code=14, mechanism="peermem")
    run_once, _ = fake_probe(gpu_error=error)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=1)
    assert report.verdict.classification == "not engaged"
    assert report.arms[1].arm == "peermem" and report.arms[1].outcome == "registration failed"
    assert any("nvidia-peermem" in cause for cause in report.verdict.likely_causes)


def test_a_host_arm_failure_is_the_run_failure():
    def run_once(local, remote):
        raise NoDevice("no RDMA device found")

    with pytest.raises(NoDevice):
        run_ab(run_once, plan_arms(GPU, HOST, False), repeats=1)


def test_no_rdma_device_under_a_gpu_arm_is_not_testable():
    def run_once(local, remote):
        raise NoRdmaDevice("no RDMA device found", "load the RDMA driver")

    with pytest.raises(NotTestable, match="not testable: no RDMA device found") as raised:
        run_ab(run_once, plan_arms(GPU, HOST, False), repeats=3)
    assert raised.value.exit_code == 9 and raised.value.fix == "load the RDMA driver"


def test_a_failed_direct_arm_ends_the_ab_after_the_repeat_it_failed_in():
    error = NotTestable("not testable: no CUDA driver", "install the driver")
    run_once, calls = fake_probe(gpu_error=error)
    report = run_ab(run_once, plan_arms(GPU, HOST, True), repeats=3)
    assert calls == ["host", "gpu", "staged"]
    assert report.verdict.classification == "not testable"


def sequence_probe(gpu_rates):
    """run_once whose GPU arm measures the given rates in turn (host: 100 Gb/s)."""
    rates = iter(gpu_rates)
    calls = []

    def run_once(local, remote):
        calls.append(local.label)
        if local.kind == "host":
            return recorded_run(100.0, {"kind": "host"})
        return recorded_run(next(rates), {"kind": "gpu", "mechanism": "dmabuf"})

    return run_once, calls


def test_with_min_repeats_sampling_stops_once_the_ratios_are_clear():
    run_once, calls = sequence_probe([97.0, 98.0, 96.0])
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=5, min_repeats=2)
    assert calls == ["host", "gpu"] * 2 and report.repeats == 2
    assert report.verdict.classification == "engaged" and not report.verdict.inconclusive


def test_ratios_that_straddle_the_threshold_sample_on_until_the_answer_is_known():
    """Three repeats straddle 0.9; at eight the median's interval drops the slowest one and
    lies above the threshold: engaged, exit 0 (the old A/B stopped at three, inconclusive)."""
    run_once, calls = sequence_probe([85.0, 95.0, 93.0, 96.0, 94.0, 97.0, 95.0, 96.0, 99.0])
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=3, min_repeats=2)
    assert calls == ["host", "gpu"] * 8 and report.repeats == 8
    assert report.verdict.classification == "engaged" and not report.verdict.inconclusive
    assert report.verdict.exit_code == 0
    assert report.verdict.ratio_min == pytest.approx(0.85)      # the range still straddles


def test_a_straddle_that_never_settles_ends_at_the_ceiling_inconclusive():
    run_once, calls = sequence_probe([85.0, 95.0] * 20)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=3, min_repeats=2,
                    settle_repeats=6)
    assert calls == ["host", "gpu"] * 6
    assert report.verdict.inconclusive and report.verdict.exit_code == 12
    unlimited, calls = sequence_probe([85.0, 95.0] * 20)
    assert run_ab(unlimited, plan_arms(GPU, HOST, False), repeats=3).repeats == 16
    assert len(calls) == 2 * 16                  # SETTLE_REPEATS, the default ceiling


def test_the_budget_ends_the_extra_repeats_and_the_answer_stays_inconclusive():
    run_once, calls = sequence_probe([85.0, 95.0] * 20)

    def budgeted(local, remote):
        if len(calls) == 10:
            raise StopSampling("the time budget holds no further run")
        return run_once(local, remote)

    report = run_ab(budgeted, plan_arms(GPU, HOST, False), repeats=3, min_repeats=2)
    assert report.repeats == 5 and report.verdict.exit_code == 12


def test_a_run_of_planned_repeats_samples_on_only_while_inconclusive():
    clear, calls = sequence_probe([97.0, 98.0, 96.0, 99.0])
    assert run_ab(clear, plan_arms(GPU, HOST, False), repeats=3).repeats == 3
    assert calls == ["host", "gpu"] * 3


def test_stop_sampling_classifies_what_was_measured():
    run_once, calls = sequence_probe([97.0, 97.0])

    def budgeted(local, remote):
        if len(calls) == 3:
            raise StopSampling("the time budget holds no further run")
        return run_once(local, remote)

    report = run_ab(budgeted, plan_arms(GPU, HOST, False), repeats=3)
    assert calls == ["host", "gpu", "host"] and report.repeats == 2
    assert report.arms[1].bandwidths_gbps == (97.0,)
    assert report.verdict.classification == "engaged"


# ---- the GPU arm as it meets a real machine (issue 9) ----------------------------------

MANAGED = MemorySpec.from_choice("gpu", memory_type="managed")


def test_managed_memory_in_auto_mode_is_memory_that_proves_nothing():
    calls = []
    report = run_ab(probe_by_mechanism({"auto": 99.0}, calls), plan_arms(MANAGED, HOST, False),
                    repeats=2)
    assert report.verdict.classification == "not testable"
    assert report.verdict.likely_causes[0].startswith("memory that proves nothing")
    assert report.verdict.exit_code == 9
    assert calls == ["host", "auto"] * 2


def test_a_cuda_error_in_the_gpu_arm_is_its_outcome_and_the_other_arms_run():
    refused = CudaError("a CUDA driver call failed (cuMemGetHandleForAddressRange(...) "
                        "returned CUDA_ERROR_UNKNOWN)", "check dmesg for Xid errors")
    calls = []
    run_once = probe_by_mechanism({"dmabuf": refused, "staged": 60.0}, calls)
    report = run_ab(run_once, plan_arms(MemorySpec.from_choice("dmabuf"), HOST, True),
                    repeats=2)
    assert report.verdict.classification == "not testable"
    assert "cuMemGetHandleForAddressRange" in report.verdict.likely_causes[0]
    dmabuf = report.arms[1]
    assert dmabuf.outcome == "not testable" and "CUDA_ERROR_UNKNOWN" in dmabuf.detail
    assert report.arms[2].bandwidths_gbps == (60.0,)        # the staged arm still ran
    assert report.arms[0].bandwidths_gbps == (100.0,)


@pytest.mark.parametrize("error, evidence_words", [
    (IntegrityError("payload corrupted at 8388608 B on the server: 8388608 of 8388608 bytes "
                    "wrong, first at offset 0", "check the IOMMU"), "first at offset 0"),
    (CompletionError("the 8388608-byte bandwidth round failed", "see dmesg",
                     evidence="work completion status 4 (local protection error), vendor "
                              "error 0x56, QP 0x11", wc_status=4), "work completion status 4"),
])
def test_a_broken_data_path_after_a_passing_host_arm_is_not_engaged(error, evidence_words):
    error.mechanism = "peermem"           # as the client names the GPU side's mechanism
    calls = []
    report = run_ab(probe_by_mechanism({"auto": error}, calls), plan_arms(GPU, HOST, False),
                    repeats=3)
    verdict = report.verdict
    assert verdict.classification == "not engaged" and verdict.mechanism == "peermem"
    assert verdict.likely_causes[0].startswith("the data path is broken")
    assert any(c.startswith("ACS") for c in verdict.likely_causes)
    assert any(c.startswith("IOMMU") for c in verdict.likely_causes)
    assert any(evidence_words in line for line in verdict.evidence)
    assert report.arms[1].outcome == "data path broken"
    assert report.arms[0].bandwidths_gbps == (100.0,)       # the host result is kept
    assert calls == ["host", "auto"]                        # no point in repeating it


def test_a_transport_retry_in_a_gpu_arm_stays_the_runs_error():
    """RNR retries say the peer or the link stalled, not that the data path dropped DMA."""
    error = CompletionError("the 1048576-byte bandwidth round failed", "see dmesg",
                            evidence="work completion status 13 (RNR retry counter "
                                     "exceeded)", wc_status=13)
    with pytest.raises(CompletionError):
        run_ab(probe_by_mechanism({"auto": error}, []), plan_arms(GPU, HOST, False), repeats=3)


def test_a_missing_cuda_python_is_a_missing_dependency_not_an_answer():
    error = MissingDependency("cuda-python is not installed", "pip install cuda-python")
    with pytest.raises(MissingDependency):
        run_ab(probe_by_mechanism({"auto": error}, []), plan_arms(GPU, HOST, False), repeats=3)


def test_the_host_arms_corruption_stays_the_runs_error():
    def run_once(local, remote):
        raise IntegrityError("payload corrupted at 8388608 B on the server", "suspect the NIC")

    with pytest.raises(IntegrityError):
        run_ab(run_once, plan_arms(GPU, HOST, False), repeats=1)


def test_the_staged_arm_competes_with_its_pipelined_bound_and_reports_both():
    import dataclasses

    def run_once(local: MemorySpec, remote: MemorySpec) -> RunReport:
        if local.kind == "host":
            return recorded_run(100.0, {"kind": "host"})
        if local.mechanism == "staged":
            run = recorded_run(40.0, {"kind": "gpu", "mechanism": "staged"})
            row = dataclasses.replace(run.bandwidth[-1], stage_copy_gbps=70.0)
            return dataclasses.replace(run, bandwidth=(row,))
        return recorded_run(60.0, {"kind": "gpu", "mechanism": "dmabuf"})

    report = run_ab(run_once, plan_arms(GPU, HOST, True), repeats=2)
    staged = report.arms[2]
    assert staged.bandwidths_gbps == (40.0, 40.0)            # serialised, as measured
    assert staged.pipelined_bound_gbps == (70.0, 70.0)       # min(copy 70, host 100)
    assert staged.detail.startswith("serialised")
    verdict = report.verdict
    assert verdict.classification == "degraded"
    assert any("no faster than the staged bounce" in line and "0.70" in line
               for line in verdict.evidence)
    assert any(line.startswith("staged: pipelined bound") for line in verdict.evidence)


# ---- the GPU on the server: its doctor's findings travel in the handshake --------------

SERVER_ACS = Finding("acs.bridge", "acs", Status.FAIL, "ACS redirect on 0000:3a:00.0 (server)",
                     fix="setpci -s 0000:3a:00.0 ECAP_ACS+0x6.w=0000")


def test_the_servers_findings_survive_the_wire_and_bad_ones_are_refused():
    from gdrprobe.errors import PeerError
    assert findings_from_message({"findings": findings_message([SERVER_ACS])}) == (SERVER_ACS,)
    assert findings_from_message({}) == ()
    bad = findings_message([SERVER_ACS])
    bad[0]["status"] = "great"
    with pytest.raises(PeerError):
        findings_from_message({"findings": bad})
    with pytest.raises(PeerError):
        findings_from_message({"findings": findings_message([SERVER_ACS]) * 40})


def test_a_remote_gpu_is_judged_by_the_servers_findings():
    import dataclasses

    def run_once(local: MemorySpec, remote: MemorySpec) -> RunReport:
        if remote.kind == "host":
            return recorded_run(100.0, {"kind": "host"})
        run = recorded_run(50.0, {"kind": "host"})
        gpu_remote = dataclasses.replace(run.remote, memory={"kind": "gpu",
                                                              "mechanism": "dmabuf"})
        return dataclasses.replace(run, remote=gpu_remote, remote_findings=(SERVER_ACS,))

    report = run_ab(run_once, plan_arms(HOST, MemorySpec.from_choice("dmabuf"), False),
                    repeats=1)
    assert report.verdict.classification == "degraded"
    assert any("ACS" in c and "confirmed by doctor" in c and "(server)" in c
               for c in report.verdict.likely_causes)
    assert "setpci" in report.verdict.fix


def test_a_broken_remote_data_path_keeps_the_servers_findings_from_the_error():
    error = IntegrityError("payload corrupted at 8388608 B on the server: all wrong, first at "
                           "offset 0", "check the IOMMU")
    error.mechanism, error.remote_findings = "dmabuf", (SERVER_ACS,)

    def run_once(local: MemorySpec, remote: MemorySpec) -> RunReport:
        if remote.kind == "host":
            return recorded_run(100.0, {"kind": "host"})
        raise error

    report = run_ab(run_once, plan_arms(HOST, MemorySpec.from_choice("dmabuf"), False),
                    repeats=1)
    assert report.verdict.likely_causes[0].startswith("the data path is broken")
    assert any("(server)" in c for c in report.verdict.likely_causes)


def test_a_gpu_arm_the_budget_never_reached_is_not_testable_and_says_why():
    run_once, calls = sequence_probe([97.0])

    def budgeted(local, remote):
        if calls:
            raise StopSampling("the time budget of 10 s holds no further run")
        return run_once(local, remote)

    report = run_ab(budgeted, plan_arms(GPU, HOST, False), repeats=3)
    assert report.arms[1].outcome == "not testable"
    assert "time budget of 10 s holds no further run" in report.arms[1].detail
    assert report.verdict.classification == "not testable"
    assert report.verdict.fix == "give the check a larger time budget"


# ---- GPU memory at both ends, and the direction that fails (issue 19) -----------------

BOTH_ENDS = MemorySpec.from_choice("gpu")


def direction_of(local: MemorySpec, remote: MemorySpec) -> str:
    return {(True, True): "both", (True, False): "read", (False, True): "write"}.get(
        (local.kind == "gpu", remote.kind == "gpu"), "host")


def directional_probe(outcomes: dict, calls: list, host_gbps=(100.0,)):
    """run_once whose arms end as outcomes[direction] says (a rate or an error); the host
    arm's rates cycle through host_gbps, run by run."""
    host_rates = iter(host_gbps * 100)

    def run_once(local: MemorySpec, remote: MemorySpec) -> RunReport:
        direction = direction_of(local, remote)
        calls.append(direction)
        if direction == "host":
            return recorded_run(next(host_rates), {"kind": "host"})
        outcome = outcomes[direction]
        if isinstance(outcome, Exception):
            raise outcome
        return recorded_run(outcome, {"kind": "gpu", "mechanism": "dmabuf"})
    return run_once


def two_ended(outcomes: dict, **kwargs):
    calls: list = []
    arms = plan_arms(BOTH_ENDS, BOTH_ENDS, False)
    report = run_ab(directional_probe(outcomes, calls, kwargs.pop("host_gbps", (100.0,))),
                    arms, repeats=3, min_repeats=2, **kwargs)
    return report, calls


def test_gpu_memory_at_both_ends_plans_one_arm_per_direction_to_diagnose():
    arms = plan_arms(BOTH_ENDS, BOTH_ENDS, with_staged=False)
    assert [(a.direction, a.role) for a in arms] == [
        ("", ""), ("both", "decides"), ("read", "diagnoses"), ("write", "diagnoses")]
    assert arms[2].remote.kind == "host" and arms[3].local.kind == "host"


def test_in_a_read_a_b_the_remote_buffer_is_the_one_the_nic_reads():
    """RDMA READ: the responder's NIC reads the remote buffer and the requester's writes the
    local one, so the arm with GPU memory only at the remote end is the read direction (the
    lab's READ throttle named "write" before)."""
    arms = plan_arms(BOTH_ENDS, BOTH_ENDS, with_staged=False, opcode="read")
    assert [(a.direction, a.local.kind, a.remote.kind) for a in arms[2:]] == [
        ("write", "gpu", "host"), ("read", "host", "gpu")]
    assert arms[1].direction == "both"
    one_end = plan_arms(BOTH_ENDS, HOST, with_staged=False, opcode="read")
    assert one_end[1].direction == "write"


def test_an_engaged_two_ended_arm_runs_no_direction_arms():
    report, calls = two_ended({"both": 97.0})
    assert calls == ["host", "both"] * 2
    assert [(arm.arm, arm.direction) for arm in report.arms] == [("host", ""), ("dmabuf", "both")]
    verdict = report.verdict
    assert verdict.classification == "engaged" and verdict.direction is None
    assert [(r.arm, r.direction, r.role) for r in verdict.arms] == [("dmabuf", "both", "decides")]


def test_a_slow_write_direction_is_named_with_nccls_receives():
    report, calls = two_ended({"both": 50.0, "read": 98.0, "write": 50.0})
    assert calls == ["host", "both"] * 2 + ["host", "read", "write"] * 2
    verdict = report.verdict
    assert verdict.classification == "degraded" and verdict.direction == "write"
    assert verdict.evidence[0].startswith(
        "failing direction: write: the NIC writing GPU memory (NCCL's receives, gdr_write)")
    assert {(r.direction, r.role) for r in verdict.arms} == {
        ("both", "decides"), ("read", "diagnoses"), ("write", "diagnoses")}
    assert [arm.direction for arm in report.arms] == ["", "both", "read", "write"]


def test_a_slow_direction_is_named_below_the_floor_too():
    from gdrprobe.report.check import FloorCheck

    floor = FloorCheck("mlx5_0", 1, 200.0, 0.8, True, False, "")
    report, _ = two_ended({"both": 50.0, "read": 98.0, "write": 50.0}, floor=floor)
    assert report.verdict.below_floor and report.verdict.direction == "write"


def test_a_broken_read_direction_is_named():
    corrupt = IntegrityError("payload corrupted at 1048576 B on the server", "check the IOMMU")
    corrupt.mechanism = "dmabuf"          # as the client names the GPU side's mechanism
    report, _ = two_ended({"both": corrupt, "read": corrupt, "write": 98.0})
    assert report.verdict.classification == "not engaged"
    assert report.verdict.direction == "read"
    assert report.verdict.likely_causes[0].startswith("the data path is broken")


def test_each_direction_keeping_up_alone_blames_both_at_once():
    report, _ = two_ended({"both": 50.0, "read": 98.0, "write": 97.0})
    assert report.verdict.direction == "both"
    assert "each direction alone keeps up" in report.verdict.evidence[0]


def test_direction_arms_pair_with_the_host_runs_of_their_own_repeats():
    # The host arm ran at 100 Gb/s while the two-ended arm did, at 200 afterwards.
    report, _ = two_ended({"both": 50.0, "read": 190.0, "write": 100.0},
                          host_gbps=(100.0, 100.0, 200.0, 200.0))
    ratios = {r.direction: r.ratio for r in report.verdict.arms}
    assert ratios["read"] == pytest.approx(0.95) and ratios["write"] == pytest.approx(0.5)
    assert report.verdict.direction == "write"


def test_a_budget_spent_before_the_direction_arms_leaves_the_direction_unknown():
    calls: list = []
    probe = directional_probe({"both": 50.0, "read": 98.0, "write": 98.0}, calls)

    def budgeted(local, remote):
        if len(calls) == 4:
            raise StopSampling("the time budget of 10 s holds no further run")
        return probe(local, remote)

    report = run_ab(budgeted, plan_arms(BOTH_ENDS, BOTH_ENDS, False), repeats=3,
                    min_repeats=2)
    assert report.verdict.classification == "degraded"
    assert report.verdict.direction == "unknown"
    assert "time budget of 10 s" in report.verdict.evidence[0]
    assert [arm.outcome for arm in report.arms[2:]] == ["not testable", "not testable"]


def test_a_refused_registration_runs_no_direction_arms():
    refused = RegistrationFailed("registering GPU memory through DMA-BUF failed", "",
                                 error_code=95, mechanism="dmabuf")
    report, calls = two_ended({"both": refused})
    assert calls == ["host", "both"]
    assert report.verdict.classification == "not engaged"
    assert report.verdict.direction == "both"


def test_the_report_keeps_the_gpu_arms_settings_and_every_arms_line_rate_share():
    from gdrprobe.report.check import FloorCheck

    floor = FloorCheck("mlx5_0", 1, 200.0, 0.8, True, False, "")
    report, _ = two_ended({"both": 97.0}, floor=floor)
    assert report.gpu_settings is not None and report.floor is floor
    assert [arm.line_rate_fraction for arm in report.arms] == [0.5, pytest.approx(0.485)]
    assert report.verdict.classification == "degraded" and report.verdict.below_floor


# ---- issue 33: ROCm's peer memory named in the verdict ------------------------------------


def test_rocm_peer_memory_is_named_peermem_amdkfd_and_cudas_stays_peermem():
    for client, named in (("amdkfd", "peermem (amdkfd)"), ("nvidia-peermem", "peermem")):
        def run_once(local, remote, client=client):
            if local.kind == "host":
                return recorded_run(100.0, {"kind": "host"})
            return recorded_run(97.0, {"kind": "gpu", "mechanism": "peermem", "peer_memory": client})
        report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=2)
        assert (report.verdict.classification, report.verdict.mechanism) == ("engaged", named)
        assert report.arms[1].arm == "peermem"          # the arm keeps its name


def test_a_refused_amdkfd_registration_names_amdkfd_in_the_verdict():
    error = RegistrationFailed("registering GPU memory through peermem failed", "load amdkfd's peer memory",
                               error_code=14, mechanism="peermem")
    error.peer_memory = "amdkfd"
    run_once, _ = fake_probe(gpu_error=error)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=1)
    assert (report.verdict.classification, report.verdict.mechanism) == ("not engaged", "peermem (amdkfd)")
    (cause,) = report.verdict.likely_causes
    assert "amdkfd's PeerDirect is not registered" in cause and "nvidia-peermem" not in cause
    assert "memory_peers/amdkfd/version appears" in report.verdict.fix
