"""GPU memory registered in NCCL's order of rungs (data-direct, plain DMA-BUF, peer memory:
gdrprobe.memory.rungs), and the rung that registered named with why, on fakes of pyverbs
and libmlx5: no NIC here, so what is tested is the order and the words, not a registration."""

from __future__ import annotations

import errno
import types

import pytest

from gdrprobe.memory import gpu as gpu_module
from gdrprobe.memory import rungs
from gdrprobe.memory.gpu import DmaBufGpuMemory
from gdrprobe.nccl import data_direct
from gdrprobe.rdma import verbs
from tests.unit.fake_cuda import fake_gpu

PATH = "/sys/devices/pci0008:00/0008:00:01.0/0008:01:00.0/0008:02:01.0/0008:04:00.0"


class Refused(Exception):
    """pyverbs' PyverbsRDMAError as far as the rungs read it."""

    def __init__(self, text, code):
        super().__init__(text)
        self.error_code = code


FakePyverbs = types.SimpleNamespace(PyverbsRDMAError=Refused)


class Region:
    lkey, rkey = 11, 22

    def __init__(self, via):
        self.via = via

    def close(self):
        pass


def test_the_ladder_is_nccls_order_and_skips_what_the_node_cannot():
    assert [r.name for r in rungs.ladder(PATH, True, True)] == [rungs.DATA_DIRECT, rungs.DMABUF, rungs.PEERMEM]
    assert [r.name for r in rungs.ladder(None, True, True)] == [rungs.DMABUF, rungs.PEERMEM]
    # data-direct is a DMA-BUF registration: without DMA-BUF it is no rung either
    assert [r.name for r in rungs.ladder(PATH, False, True)] == [rungs.PEERMEM]
    assert rungs.ladder(None, False, False) == ()


def test_a_refused_rung_falls_to_the_next_and_the_reason_names_both():
    def attempt(rung):
        if rung.name == rungs.DATA_DIRECT:
            raise Refused("Failed to register a data-direct dma-buf MR", errno.EOPNOTSUPP)
        return rung.name
    climbed = rungs.climb(rungs.ladder(PATH, True, True), attempt, Refused)
    assert (climbed.rung.name, climbed.region) == (rungs.DMABUF, rungs.DMABUF)
    assert climbed.reason.startswith("mlx5dv_reg_dmabuf_mr(MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT) refused")
    assert "then registered through ibv_reg_dmabuf_mr" in climbed.reason
    first = rungs.climb(rungs.ladder(PATH, True, True), lambda rung: rung.name, Refused)
    assert first.rung.name == rungs.DATA_DIRECT and first.refused == () and PATH in first.reason


def test_every_rung_refused_says_each_and_keeps_the_last_error():
    def attempt(rung):
        raise Refused(f"{rung.name} no", errno.EINVAL)
    with pytest.raises(rungs.NoRungHeld) as raised:
        rungs.climb(rungs.ladder(PATH, True, True), attempt, Refused)
    assert [rung.name for rung, _ in raised.value.refused] == [rungs.DATA_DIRECT, rungs.DMABUF, rungs.PEERMEM]
    assert str(raised.value.last) == "peermem no"


def test_an_error_that_is_no_refusal_is_not_swallowed():
    with pytest.raises(KeyError):
        rungs.climb(rungs.ladder(PATH, True, False), lambda rung: {}["bug"], Refused)


@pytest.fixture
def registrations(monkeypatch):
    """Which rung registered: data-direct refuses with ``refuse_data_direct``'s errno."""
    calls = []
    state = {"refuse": None}

    def data_direct(pd, length, access, fd, offset):
        calls.append(rungs.DATA_DIRECT)
        if state["refuse"]:
            raise Refused("Failed to register a data-direct dma-buf MR", state["refuse"])
        return Region(rungs.DATA_DIRECT), "libmlx5 (fake)"

    def plain(pv, pd, length, access, fd, offset):
        calls.append(rungs.DMABUF)
        return Region(rungs.DMABUF), "pyverbs' DmaBufMR"

    monkeypatch.setattr(verbs, "pyverbs", lambda: FakePyverbs)
    monkeypatch.setattr(gpu_module, "register_data_direct", data_direct)
    monkeypatch.setattr(gpu_module, "dmabuf_mr", plain)
    return calls, state


def test_a_data_direct_nic_registers_through_its_rung(registrations):
    calls, _ = registrations
    _, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192, data_direct=PATH) as memory:
        memory.register("pd")
        described = memory.describe()
    assert calls == [rungs.DATA_DIRECT] and described["registration_rung"] == rungs.DATA_DIRECT
    assert PATH in described["registration_rung_reason"]


def test_a_refused_data_direct_registration_falls_to_plain_dmabuf(registrations):
    calls, state = registrations
    state["refuse"] = errno.EOPNOTSUPP
    _, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192, data_direct=PATH) as memory:
        memory.register("pd")
        described = memory.describe()
    assert calls == [rungs.DATA_DIRECT, rungs.DMABUF] and described["registration_rung"] == rungs.DMABUF
    assert "MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT) refused" in described["registration_rung_reason"]


def test_a_nic_without_data_direct_goes_straight_to_plain_dmabuf(registrations):
    calls, _ = registrations
    _, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192) as memory:
        memory.register("pd")
        assert memory.describe()["registration_rung"] == rungs.DMABUF
    assert calls == [rungs.DMABUF]


def test_both_dmabuf_rungs_refused_is_an_error_naming_each(registrations, monkeypatch):
    calls, state = registrations
    state["refuse"] = errno.EOPNOTSUPP

    def plain(pv, pd, length, access, fd, offset):
        calls.append(rungs.DMABUF)
        raise Refused("Failed to register a dma-buf MR", errno.EINVAL)

    monkeypatch.setattr(gpu_module, "dmabuf_mr", plain)
    _, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192, data_direct=PATH) as memory:
        with pytest.raises(Exception) as raised:
            memory.register("pd")
    assert calls == [rungs.DATA_DIRECT, rungs.DMABUF]
    assert "rungs refused: mlx5dv_reg_dmabuf_mr(MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)" in raised.value.evidence


# ---- the face of the NIC NCCL chose (gdrprobe.nccl.data_direct.nccl_face) ----------------------


def test_on_nccl_s_data_direct_device_a_refusal_is_not_engaged_never_plain_dmabuf(registrations):
    """net_ib/reg.cc: on <dev>_dma NCCL registers through mlx5dv_reg_dmabuf_mr with
    MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT and nothing else: the job's registration fails."""
    calls, state = registrations
    state["refuse"] = errno.EOPNOTSUPP
    _, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192, data_direct=PATH, face=data_direct.DATA_DIRECT,
                         face_reason="NCCL uses mlx5_0_dma") as memory:
        with pytest.raises(Exception) as raised:
            memory.register("pd")
    assert calls == [rungs.DATA_DIRECT]
    assert "MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT" in raised.value.evidence
    assert "no fallback" in raised.value.evidence and "NCCL uses mlx5_0_dma" in raised.value.evidence
    assert "NCCL_IB_DATA_DIRECT=0" in raised.value.fix
    assert raised.value.cause.startswith("NCCL's only registration on <dev>_dma")


@pytest.mark.parametrize("face, why, rung", [
    (data_direct.DATA_DIRECT, "NCCL uses mlx5_0_dma", rungs.DATA_DIRECT),
    # NCCL_IB_DATA_DIRECT=0 (the doctor's own fix), an older release, or a decision for the
    # device itself: ibv_reg_dmabuf_mr, the data-direct rung never tried
    (data_direct.ORDINARY, "NCCL_IB_DATA_DIRECT=0: NCCL opens mlx5_0 alone", rungs.DMABUF)])
def test_on_nccl_s_face_only_its_rung_is_tried_and_it_says_why(registrations, face, why, rung):
    calls, _ = registrations
    _, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192, data_direct=PATH, face=face, face_reason=why) as memory:
        memory.register("pd")
        described = memory.describe()
    assert calls == [rung] and described["registration_rung"] == rung
    assert why in described["registration_rung_reason"]


@pytest.mark.parametrize("face, expected", [
    (data_direct.DATA_DIRECT, [rungs.DATA_DIRECT]), (data_direct.ORDINARY, [rungs.DMABUF]),
    ("", [rungs.DATA_DIRECT, rungs.DMABUF])])
def test_the_ladder_of_each_face(face, expected):
    assert [r.name for r in rungs.ladder(PATH, True, False, face)] == expected
    # a NIC that is no data-direct one has its plain rung whatever the face
    assert [r.name for r in rungs.ladder(None, True, False, face)] == [rungs.DMABUF]
