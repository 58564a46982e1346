"""The verdict on recorded measurement sets: each class, the causes, the noisy boundary."""

from __future__ import annotations

import errno

import pytest

from gdrprobe.errors import DRAIN_CODES, ExitCode
from gdrprobe.report.model import Finding, Status
from gdrprobe.report.check import NOT_USED, FloorCheck, NcclUse
from gdrprobe.campaign.verdict import (DEGRADED, ENGAGED, NOT_ENGAGED, NOT_TESTABLE, ArmMeasurement,
                              classify, disturbed, paired_ratios, with_nccl)

MiB = 1 << 20

# A 400G ConnectX-7 pair, 8 MiB writes, five alternating repeats.
HOST_400G = ArmMeasurement("host", (388.1, 387.9, 388.4, 388.0, 388.2), memory_kind="host",
                           message_bytes=8 * MiB)
DMABUF_LINE_RATE = ArmMeasurement("dmabuf", (386.5, 387.2, 385.9, 387.0, 386.8), "dmabuf",
                                  mechanism_reason="auto: the GPU can export DMA-BUF and the NIC "
                                                   "path exists")
PEERMEM_LINE_RATE = ArmMeasurement("peermem", (381.0, 383.5, 382.2, 380.9, 382.0), "peermem")
STAGED_BOUNCE = ArmMeasurement("staged", (201.0, 198.5, 199.7, 200.3, 199.9), "staged")
# The same box with ACS redirecting peer traffic through the root complex.
DMABUF_ACS = ArmMeasurement("dmabuf", (187.2, 190.4, 188.8, 189.5, 188.1), "dmabuf")


def finding(id, status, summary="", fix=""):
    return Finding(id, id.split(".")[0], status, summary or id, fix=fix)


HEALTHY_FINDINGS = (
    finding("topology.distance", Status.OK, "GPU and NIC share a PCIe switch (PIX)"),
    finding("iommu.domain", Status.OK, "IOMMU in passthrough"),
    finding("gpu.0000:3b:00.0.bar1", Status.OK, "BAR1 of 0000:3b:00.0 is 131072 MiB"),
)
ACS_FAIL = finding("acs.bridge", Status.FAIL, "ACS redirect enabled on 0000:3a:00.0",
                   fix="disable ACS on the bridges (setpci ECAP_ACS+0x6.w=0000)")


# ---- engaged ----------------------------------------------------------------------


def test_dmabuf_at_line_rate_is_engaged():
    verdict = classify(HOST_400G, [DMABUF_LINE_RATE])
    assert verdict.classification == ENGAGED
    assert verdict.mechanism == "dmabuf"
    assert verdict.ratio == pytest.approx(386.8 / 388.0, abs=1e-3)
    assert 0.99 < verdict.ratio_min <= verdict.ratio <= verdict.ratio_max < 1.0
    assert not verdict.inconclusive
    assert verdict.exit_code == ExitCode.OK == 0
    assert verdict.likely_causes == () and verdict.fix == ""
    assert any("auto: the GPU can export" in line for line in verdict.evidence)
    assert any(line.startswith("host: median 388.1 Gb/s at 8388608 B") for line in verdict.evidence)


def test_the_best_direct_arm_names_the_mechanism_and_staged_is_only_evidence():
    verdict = classify(HOST_400G, [STAGED_BOUNCE, PEERMEM_LINE_RATE])
    assert verdict.classification == ENGAGED
    assert verdict.mechanism == "peermem"
    assert {r.arm for r in verdict.arms} == {"staged", "peermem"}
    staged = next(r for r in verdict.arms if r.arm == "staged")
    assert staged.ratio == pytest.approx(0.515, abs=0.005)


def test_the_ratio_exactly_at_the_threshold_is_engaged():
    host = ArmMeasurement("host", (100.0, 100.0), memory_kind="host")
    gpu = ArmMeasurement("dmabuf", (90.0, 90.0), "dmabuf")
    verdict = classify(host, [gpu])
    assert verdict.classification == ENGAGED and verdict.ratio == pytest.approx(0.9)


def test_the_threshold_is_configurable():
    verdict = classify(HOST_400G, [PEERMEM_LINE_RATE], threshold=0.99)
    assert verdict.classification == DEGRADED
    assert verdict.threshold == 0.99


@pytest.mark.parametrize("threshold", [0, -0.5, 1.2])
def test_a_threshold_outside_zero_to_one_is_refused(threshold):
    with pytest.raises(ValueError):
        classify(HOST_400G, [DMABUF_LINE_RATE], threshold=threshold)


# ---- degraded ---------------------------------------------------------------------


def test_half_rate_with_no_doctor_findings_lists_every_cause_as_possible():
    verdict = classify(HOST_400G, [DMABUF_ACS])
    assert verdict.classification == DEGRADED
    assert verdict.mechanism == "dmabuf"
    assert verdict.ratio == pytest.approx(188.8 / 388.1, abs=2e-3)
    assert verdict.exit_code == ExitCode.VERDICT_NOT_OK == 1
    assert [cause.split(":")[0] for cause in verdict.likely_causes] == [
        "distance", "ACS", "IOMMU", "BAR1"]
    assert all("possible" in cause for cause in verdict.likely_causes)
    assert "gdrprobe doctor" in verdict.fix


def test_doctor_findings_confirm_one_cause_and_rule_out_the_others():
    verdict = classify(HOST_400G, [DMABUF_ACS], doctor_findings=HEALTHY_FINDINGS + (ACS_FAIL,))
    assert verdict.classification == DEGRADED
    assert len(verdict.likely_causes) == 1
    assert verdict.likely_causes[0].startswith("ACS")
    assert "confirmed by doctor: ACS redirect enabled on 0000:3a:00.0" in verdict.likely_causes[0]
    assert verdict.fix == "disable ACS on the bridges (setpci ECAP_ACS+0x6.w=0000)"
    ruled_out = [line for line in verdict.evidence if line.startswith("ruled out by doctor")]
    assert ruled_out == ["ruled out by doctor: distance", "ruled out by doctor: IOMMU",
                         "ruled out by doctor: BAR1"]


def test_a_warning_confirms_too_and_skipped_checks_stay_possible():
    findings = (finding("topology.distance", Status.WARN, "GPU and NIC are SYS apart"),
                finding("iommu.domain", Status.SKIP, "no IOMMU groups"))
    verdict = classify(HOST_400G, [DMABUF_ACS], doctor_findings=findings)
    distance, *others = verdict.likely_causes
    assert "confirmed by doctor: GPU and NIC are SYS apart" in distance
    assert [c.split(":")[0] for c in others] == ["ACS", "IOMMU", "BAR1"]


def test_a_direct_arm_no_faster_than_staging_says_so():
    bouncing = ArmMeasurement("peermem", (196.0, 197.2, 195.5, 196.4, 196.9), "peermem")
    verdict = classify(HOST_400G, [bouncing, STAGED_BOUNCE])
    assert verdict.classification == DEGRADED
    assert any("no faster than the staged bounce" in line for line in verdict.evidence)


# ---- not engaged ------------------------------------------------------------------


def test_peermem_efault_means_no_peer_memory_client():
    failed = ArmMeasurement("peermem", mechanism="peermem", registration_errno=errno.EFAULT)
    verdict = classify(HOST_400G, [failed])
    assert verdict.classification == NOT_ENGAGED
    assert verdict.mechanism == "peermem"
    assert verdict.ratio is None
    assert verdict.exit_code == ExitCode.VERDICT_NOT_OK
    assert "registration failed with EFAULT" in verdict.likely_causes[0]
    assert "nvidia-peermem is not loaded" in verdict.likely_causes[0]
    assert "modprobe nvidia-peermem" in verdict.fix
    assert "peermem: memory registration failed with EFAULT" in verdict.evidence


def test_rxe_fails_both_mechanisms_and_names_both_causes():
    dmabuf = ArmMeasurement("dmabuf", mechanism="dmabuf", registration_errno=errno.EOPNOTSUPP)
    peermem = ArmMeasurement("peermem", mechanism="peermem", registration_errno=errno.EFAULT)
    scatter = finding("nic.mlx5_scatter_to_cqe", Status.WARN, "MLX5_SCATTER_TO_CQE is unset")
    verdict = classify(HOST_400G, [dmabuf, peermem], doctor_findings=(scatter,))
    assert verdict.classification == NOT_ENGAGED
    assert verdict.mechanism == "dmabuf"
    assert "dmabuf: registration failed with EOPNOTSUPP" in verdict.likely_causes[0]
    assert "peermem: registration failed with EFAULT" in verdict.likely_causes[1]
    assert "peermem with nvidia-peermem loaded" in verdict.fix
    assert "doctor: MLX5_SCATTER_TO_CQE is unset" in verdict.evidence


def test_old_kernel_and_memlock_errnos():
    old_kernel = ArmMeasurement("dmabuf", mechanism="dmabuf",
                                registration_errno=errno.EPROTONOSUPPORT)
    assert "5.12" in classify(HOST_400G, [old_kernel]).likely_causes[0]
    memlock = ArmMeasurement("peermem", mechanism="peermem", registration_errno=errno.ENOMEM)
    verdict = classify(HOST_400G, [memlock])
    assert "locked-memory limit" in verdict.likely_causes[0] and "BAR1" in verdict.fix


def test_a_working_arm_wins_over_a_failed_one():
    failed = ArmMeasurement("dmabuf", mechanism="dmabuf", registration_errno=errno.EOPNOTSUPP)
    verdict = classify(HOST_400G, [failed, PEERMEM_LINE_RATE])
    assert verdict.classification == ENGAGED and verdict.mechanism == "peermem"
    assert "dmabuf: memory registration failed with EOPNOTSUPP" in verdict.evidence


# ---- not testable -----------------------------------------------------------------


def test_no_rdma_device_is_not_testable():
    host = ArmMeasurement("host", memory_kind="host", not_testable="no RDMA device found",
                          fix="load the RDMA driver")
    verdict = classify(host, [DMABUF_LINE_RATE])
    assert verdict.classification == NOT_TESTABLE
    assert verdict.exit_code == ExitCode.NOT_TESTABLE == 9
    assert verdict.likely_causes == ("no RDMA device found",)
    assert verdict.fix == "load the RDMA driver"


def test_no_cuda_driver_is_not_testable_with_the_host_result_kept():
    gpu = ArmMeasurement("dmabuf", mechanism="dmabuf",
                         not_testable="not testable: no CUDA driver (libcuda.so.1 could not "
                                      "be loaded)", fix="install the NVIDIA driver")
    verdict = classify(HOST_400G, [gpu])
    assert verdict.classification == NOT_TESTABLE
    assert "no CUDA driver" in verdict.likely_causes[0]
    assert verdict.fix == "install the NVIDIA driver"
    assert verdict.evidence[0].startswith("host: median 388.1 Gb/s")


@pytest.mark.parametrize("kind", ["managed", "pinned-host"])
def test_managed_or_host_memory_is_not_a_gpudirect_proof(kind):
    fast = ArmMeasurement("peermem", DMABUF_LINE_RATE.bandwidths_gbps, "peermem", memory_kind=kind)
    verdict = classify(HOST_400G, [fast])
    assert verdict.classification == NOT_TESTABLE
    assert verdict.likely_causes[0].startswith("memory that proves nothing")
    assert f"used {kind} memory" in verdict.likely_causes[0]
    assert any("not a GPUDirect proof" in line for line in verdict.evidence)


@pytest.mark.parametrize("kind", ["managed", "pinned-host"])
def test_a_refused_registration_of_managed_memory_still_proves_nothing(kind):
    refused = ArmMeasurement("peermem", (), "peermem", memory_kind=kind,
                             registration_errno=errno.EFAULT)
    verdict = classify(HOST_400G, [refused])
    assert verdict.classification == NOT_TESTABLE
    assert verdict.likely_causes[0].startswith("memory that proves nothing")
    assert verdict.exit_code == ExitCode.NOT_TESTABLE


# ---- not engaged: the data path is broken -----------------------------------------

CORRUPT = ("payload corrupted at 1048576 B on the server: 1048576 of 1048576 bytes wrong, "
           "first at offset 0")
IOMMU_FAIL = finding("iommu.domain", Status.FAIL, "0000:3b:00.0 is in a DMA (translating) "
                     "domain", fix="boot with iommu=pt")


def test_a_broken_data_path_is_not_engaged_with_acs_and_iommu_as_causes():
    broken = ArmMeasurement("dmabuf", (), "dmabuf", data_path_error=CORRUPT)
    verdict = classify(HOST_400G, [broken], doctor_findings=(ACS_FAIL, IOMMU_FAIL))
    assert verdict.classification == NOT_ENGAGED and verdict.mechanism == "dmabuf"
    assert verdict.likely_causes[0].startswith("the data path is broken")
    assert any("ACS" in c and "confirmed by doctor" in c for c in verdict.likely_causes)
    assert any("IOMMU" in c and "confirmed by doctor" in c for c in verdict.likely_causes)
    assert any(c.startswith("root complex") for c in verdict.likely_causes)
    assert "setpci" in verdict.fix and "iommu=pt" in verdict.fix
    assert f"dmabuf: {CORRUPT}" in verdict.evidence       # the offsets are the evidence
    assert verdict.exit_code == ExitCode.VERDICT_NOT_OK


def test_a_failed_completion_with_acs_cleared_leaves_iommu_and_root_complex():
    wc = ("the 1048576-byte bandwidth round failed; work completion status 4 "
          "(local protection error)")
    broken = ArmMeasurement("peermem", (), "peermem", data_path_error=wc)
    clear = (finding("acs.bridge", Status.OK, "no ACS redirect"),)
    verdict = classify(HOST_400G, [broken], doctor_findings=clear)
    assert verdict.classification == NOT_ENGAGED
    assert "ruled out by doctor: ACS" in verdict.evidence
    assert not any(c.startswith("ACS") for c in verdict.likely_causes)
    assert any(c.startswith("IOMMU") and "possible" in c for c in verdict.likely_causes)
    assert "run 'gdrprobe doctor'" in verdict.fix
    assert any("work completion status 4" in line for line in verdict.evidence)


def test_no_gpu_arm_is_not_testable():
    verdict = classify(HOST_400G, [])
    assert verdict.classification == NOT_TESTABLE
    assert "no GPU arm ran" in verdict.likely_causes[0]


def test_staged_alone_proves_nothing():
    verdict = classify(HOST_400G, [STAGED_BOUNCE])
    assert verdict.classification == NOT_TESTABLE


def test_a_host_arm_without_bandwidth_is_not_testable():
    verdict = classify(ArmMeasurement("host", (0.0, 0.0), memory_kind="host"),
                       [DMABUF_LINE_RATE])
    assert verdict.classification == NOT_TESTABLE
    assert "host arm measured no bandwidth" in verdict.likely_causes[0]


# ---- the noisy boundary -------------------------------------------------------------


def test_median_at_the_threshold_with_a_low_repeat_is_engaged_but_inconclusive():
    host = ArmMeasurement("host", (100.0, 100.0, 100.0), memory_kind="host")
    gpu = ArmMeasurement("dmabuf", (80.0, 95.0, 90.0), "dmabuf")
    verdict = classify(host, [gpu])
    assert verdict.classification == ENGAGED
    assert (verdict.ratio, verdict.ratio_min, verdict.ratio_max) == pytest.approx((0.9, 0.8, 0.95))
    assert verdict.inconclusive
    # The classification is the median's, kept as information; the answer is not known.
    assert verdict.exit_code == ExitCode.INCONCLUSIVE == 12
    assert any(line.startswith("inconclusive: the per-repeat GPU/host ratios 0.80..0.95 (the "
                               "median's 90% interval 0.80..0.95, 3 repeats) straddle the "
                               "threshold 0.90") for line in verdict.evidence)


def test_median_below_with_a_high_repeat_is_degraded_but_inconclusive_and_never_drains():
    host = ArmMeasurement("host", (100.0, 100.0, 100.0, 100.0, 100.0), memory_kind="host")
    gpu = ArmMeasurement("peermem", (86.0, 88.0, 93.0, 87.5, 89.0), "peermem")
    verdict = classify(host, [gpu])
    assert verdict.classification == DEGRADED
    assert verdict.ratio == pytest.approx(0.88)
    assert verdict.inconclusive
    assert verdict.exit_code == 12 and verdict.exit_code not in DRAIN_CODES


def test_the_loaded_labs_spread_is_inconclusive_not_a_drain():
    """issue 28: ./dev demo-dmabuf on a loaded machine answered "degraded, inconclusive
    (0.63..1.06)" with exit 1."""
    host = ArmMeasurement("host", (10.0,) * 5, memory_kind="host")
    gpu = ArmMeasurement("dmabuf", (6.3, 8.4, 10.6, 7.9, 9.7), "dmabuf")
    verdict = classify(host, [gpu])
    assert (verdict.classification, verdict.ratio_min, verdict.ratio_max) == (
        DEGRADED, pytest.approx(0.63), pytest.approx(1.06))
    assert verdict.exit_code == 12


@pytest.mark.parametrize("n, dropped", [(2, 0), (4, 0), (5, 0), (7, 0), (8, 1), (10, 1),
                                        (11, 2), (13, 3), (16, 4), (20, 5)])
def test_the_medians_interval_drops_what_the_sign_test_allows(n, dropped):
    """P(Binomial(n, 1/2) <= d) <= 0.05 for the d dropped at each end, and > 0.05 for d+1."""
    from math import comb

    from gdrprobe.campaign.verdict import median_interval, trimmed_per_end

    assert trimmed_per_end(n) == dropped
    if n >= 5:
        assert sum(comb(n, k) for k in range(dropped + 1)) / 2 ** n <= 0.05
    assert sum(comb(n, k) for k in range(dropped + 2)) / 2 ** n > 0.05
    values = list(range(n))
    assert median_interval(values) == (dropped, n - 1 - dropped)


def test_more_repeats_settle_a_spread_that_the_range_never_would():
    """Two disturbed repeats of sixteen: the range still straddles 0.9, the median's interval
    (the 4 most extreme at each end dropped) does not: conclusive both ways."""
    host = ArmMeasurement("host", (100.0,) * 16, memory_kind="host")
    slow = ArmMeasurement("dmabuf", (85.0,) * 7 + (95.0, 96.0) + (84.0,) * 7, "dmabuf")
    fast = ArmMeasurement("dmabuf", (97.0,) * 7 + (80.0, 81.0) + (98.0,) * 7, "dmabuf")
    degraded, engaged = classify(host, [slow]), classify(host, [fast])
    assert degraded.ratio_max > 0.9 > degraded.ratio_min and not degraded.inconclusive
    assert (degraded.classification, degraded.exit_code) == (DEGRADED, 1)
    assert degraded.arms[0].interval == pytest.approx((0.84, 0.85))
    assert engaged.ratio_min < 0.9 < engaged.ratio_max and not engaged.inconclusive
    assert (engaged.classification, engaged.exit_code) == (ENGAGED, 0)
    assert any("the median's 90% interval 0.97..0.98" in line for line in engaged.evidence)


def test_line_rate_shares_that_straddle_the_floor_are_inconclusive():
    host = ArmMeasurement("host", (301.0, 341.0, 386.0), memory_kind="host")
    gpu = ArmMeasurement("dmabuf", (300.0, 340.0, 385.0), "dmabuf")   # 0.75..0.96 of 400
    verdict = classify(host, [gpu], floor=NDR_PORT)
    assert verdict.ratio > 0.99 and verdict.arms[0].line_rate_fraction == 0.85
    assert verdict.classification == ENGAGED and verdict.exit_code == 12
    assert verdict.arms[0].line_rate_interval == pytest.approx((0.75, 0.9625))
    assert any("straddle the floor 0.80" in line for line in verdict.evidence)
    below = classify(host, [ArmMeasurement("dmabuf", (300.0, 310.0, 315.0), "dmabuf")],
                     floor=NDR_PORT)
    assert below.below_floor and below.exit_code == 1 and not below.inconclusive


def test_a_tight_spread_below_the_threshold_is_conclusive():
    verdict = classify(HOST_400G, [DMABUF_ACS])
    assert not verdict.inconclusive
    assert not any("inconclusive" in line for line in verdict.evidence)


def test_repeats_pair_by_index_and_unpaired_ones_are_dropped():
    assert paired_ratios((100.0, 200.0, 50.0), (90.0, 100.0)) == [0.9, 0.5]
    assert paired_ratios((0.0, 100.0), (10.0, 95.0)) == [0.95]
    host = ArmMeasurement("host", (100.0, 200.0, 50.0), memory_kind="host")
    verdict = classify(host, [ArmMeasurement("dmabuf", (90.0, 100.0), "dmabuf")])
    assert verdict.arms[0].repeats == 2


# ---- the absolute floor (issue 19) ----------------------------------------------------


NDR_PORT = FloorCheck("mlx5_0", 1, 400.0, 0.8, applied=True, software_device=False,
                      note="0.80 of 400 Gb/s = 320 Gb/s")


def test_both_arms_crippled_alike_fall_below_the_floor():
    """A ratio near 1 says nothing when both arms reach half the port (a translating IOMMU,
    a far NUMA node, a NIC on a narrower link)."""
    host = ArmMeasurement("host", (201.0, 199.0), memory_kind="host")
    gpu = ArmMeasurement("dmabuf", (198.0, 197.0), "dmabuf", direction="both")
    verdict = classify(host, [gpu], floor=NDR_PORT)
    assert verdict.classification == DEGRADED and verdict.below_floor
    assert verdict.ratio > 0.9 and verdict.exit_code == 1
    assert verdict.arms[0].line_rate_fraction == pytest.approx(0.49, abs=0.01)
    assert any(line.startswith("below the floor: dmabuf reached 0.49 of the port's 400 Gb/s")
               for line in verdict.evidence)
    assert verdict.likely_causes[0].startswith("the NIC's PCIe link")
    assert verdict.direction is None


def test_the_floor_is_not_applied_to_a_software_device_or_an_unknown_rate():
    host = ArmMeasurement("host", (2.0, 2.1), memory_kind="host")
    gpu = ArmMeasurement("peermem", (2.0, 2.0), "peermem")
    rxe = FloorCheck("rxe0", 1, 10.0, 0.8, applied=False, software_device=True, note="")
    verdict = classify(host, [gpu], floor=rxe)
    assert verdict.classification == ENGAGED and not verdict.below_floor
    assert verdict.arms[0].line_rate_fraction == pytest.approx(0.2)   # said, not applied


def test_at_line_rate_the_floor_changes_nothing():
    verdict = classify(HOST_400G, [DMABUF_LINE_RATE], floor=NDR_PORT)
    assert verdict.classification == ENGAGED
    assert verdict.arms[0].line_rate_fraction == pytest.approx(0.967, abs=1e-3)


def test_a_not_testable_verdict_still_lists_its_arms():
    gpu = ArmMeasurement("dmabuf", mechanism="dmabuf", not_testable="not testable: no CUDA "
                         "driver", direction="both")
    verdict = classify(HOST_400G, [gpu])
    assert verdict.classification == NOT_TESTABLE
    assert [(r.arm, r.outcome, r.ratio) for r in verdict.arms] == [
        ("dmabuf", "not testable", None)]


# ---- NCCL's own decision (issue 19) ----------------------------------------------------

def nccl_use(**fields) -> NcclUse:
    base = dict(gpu="0000:1b:00.0", nic="mlx5_0", path="direct", via_gpu=None, receives=False,
                sends=False, reasons=("receive: path SYS is beyond the GDR level PXB",
                                      "send: path SYS is beyond the GDR level PXB"))
    return NcclUse(**{**base, **fields})


ENGAGED_VERDICT = classify(HOST_400G, [DMABUF_LINE_RATE])


def test_an_nccl_setting_that_turns_gdr_off_warns_with_the_variable_as_cause():
    use = nccl_use(cause="NCCL_NET_GDR_LEVEL=LOC (environment): ...",
                   settings=("NCCL_NET_GDR_LEVEL=LOC (environment)",),
                   fix="if this job should use GPUDirect RDMA, unset NCCL_NET_GDR_LEVEL=LOC")
    verdict = with_nccl(ENGAGED_VERDICT, use)
    assert verdict.classification == NOT_USED
    assert verdict.exit_code == ExitCode.NCCL_SETTING == 10
    assert verdict.likely_causes == (use.cause,) and "unset NCCL_NET_GDR_LEVEL" in verdict.fix
    assert verdict.evidence[0].startswith("NCCL: will not use GPUDirect RDMA here")
    assert "the A/B: engaged (GPU/host 1.00)" in verdict.evidence


def test_a_topology_that_makes_nccl_refuse_gdr_drains():
    use = nccl_use(cause="receive: path SYS is beyond the GDR level P2C (NCCL's default)",
                   node_fault=True, fix="Put the NIC under the same PCIe switch as the GPU")
    verdict = with_nccl(ENGAGED_VERDICT, use)
    assert verdict.classification == NOT_USED and verdict.exit_code == 1


def test_a_node_fault_the_ab_found_stays_whatever_nccl_does():
    degraded = classify(HOST_400G, [DMABUF_ACS])
    verdict = with_nccl(degraded, nccl_use(cause="NCCL_IB_DISABLE=1", settings=("x",)))
    assert verdict.classification == DEGRADED and verdict.exit_code == 1
    assert verdict.nccl is not None and verdict.evidence[0].startswith("NCCL: will not use")


def test_a_decision_on_facts_the_doctor_could_not_read_is_evidence_only():
    verdict = with_nccl(ENGAGED_VERDICT, nccl_use(cause="...", node_fault=True, firm=False))
    assert verdict.classification == ENGAGED and verdict.exit_code == 0


def test_gdr_for_one_direction_only_is_said_not_judged():
    use = nccl_use(receives=True, reasons=(
        "receive: path PIX <= GDR level PXB",
        "send: sm70 is older than Ampere and has no NVLink peer: NCCL_NET_GDR_READ's "
        "default keeps send-side GDR off to spare the PCIe bus"))
    verdict = with_nccl(ENGAGED_VERDICT, use)
    assert verdict.classification == ENGAGED
    assert verdict.evidence[0].startswith(
        "NCCL: uses GPUDirect RDMA for receives only through mlx5_0; send: sm70")


def test_an_inconclusive_degraded_answer_lets_nccls_firm_decision_speak():
    host = ArmMeasurement("host", (100.0,) * 3, memory_kind="host")
    straddling = classify(host, [ArmMeasurement("dmabuf", (80.0, 95.0, 85.0), "dmabuf")])
    assert straddling.classification == DEGRADED and straddling.exit_code == 12
    node = with_nccl(straddling, nccl_use(cause="path SYS", node_fault=True))
    setting = with_nccl(straddling, nccl_use(cause="NCCL_NET_GDR_LEVEL=LOC", settings=("x",)))
    assert (node.classification, node.exit_code) == (NOT_USED, 1)
    assert (setting.classification, setting.exit_code) == (NOT_USED, 10)


# ---- another job's traffic (issue 28) ---------------------------------------------------

FOREIGN = ("run 2: rxe0 port 1 sent 9100 packets, the probe's own at most 4200",)


def test_other_traffic_on_the_port_makes_a_measured_answer_inconclusive():
    degraded = classify(HOST_400G, [DMABUF_ACS])
    for verdict in (ENGAGED_VERDICT, degraded):
        seen = disturbed(verdict, FOREIGN)
        assert seen.classification == verdict.classification and seen.inconclusive
        assert seen.exit_code == ExitCode.INCONCLUSIVE
        assert seen.evidence[1] == "another job's traffic: " + FOREIGN[0]
    assert disturbed(ENGAGED_VERDICT, ()) == ENGAGED_VERDICT


def test_other_traffic_does_not_excuse_a_refused_registration():
    refused = classify(HOST_400G, [ArmMeasurement("dmabuf", mechanism="dmabuf",
                                                  registration_errno=errno.EFAULT)])
    seen = disturbed(refused, FOREIGN)
    assert (seen.classification, seen.exit_code, seen.inconclusive) == (NOT_ENGAGED, 1, False)
    assert seen.evidence[-1] == "another job's traffic: " + FOREIGN[0]
