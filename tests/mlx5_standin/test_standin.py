"""gdrprobe's libmlx5 calls (gdrprobe.rdma.mlx5dv) against the stand-in libmlx5.so.1: the
versioned lookups NCCL makes (MLX5_1.25), the data-direct path and its errors, and the
registration refused by knob. No RDMA device is needed for these; the forwarded
registration (a real PD) is the lab's. Run: ``python -m pytest tests/mlx5_standin``."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import shutil

import pytest

from gdrprobe.rdma import mlx5dv

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
PATH = "/devices/pci0008:00/0008:00:01.0/0008:01:00.0/0008:02:01.0/0008:04:00.0"


@pytest.fixture(scope="module")
def library():
    from tests.mlx5_standin.build import build
    try:
        return mlx5dv.Mlx5dv(str(build()))
    except mlx5dv.Unavailable as error:     # no libibverbs on this machine
        pytest.skip(str(error))


def lookup(library) -> tuple[int, str]:
    buffer = ctypes.create_string_buffer(mlx5dv.PATH_MAX)
    code = library.get_data_direct_sysfs_path(None, buffer, mlx5dv.PATH_MAX)
    return code, buffer.value.decode()


def test_the_versioned_symbols_are_found_as_nccl_finds_them(library):
    assert library.get_data_direct_sysfs_path is not None and library.mlx5_reg_dmabuf_mr is not None
    assert library.is_supported is not None


def test_the_path_comes_back_without_sys_and_enodev_without_one(library, monkeypatch):
    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_PATH", PATH)
    assert lookup(library) == (0, PATH)
    monkeypatch.delenv("GDRPROBE_MLX5_STANDIN_PATH")
    assert lookup(library)[0] == errno.ENODEV
    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_PATH_ERRNO", str(errno.EOPNOTSUPP))
    assert lookup(library)[0] == errno.EOPNOTSUPP


def test_a_refused_registration_reads_back_its_errno(library, monkeypatch):
    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_DD_ERRNO", str(errno.EPERM))
    data_direct = (None, 0, 0, 0, -1, 0, mlx5dv.MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT)
    assert library.refusal(library.mlx5_reg_dmabuf_mr, *data_direct) == errno.EPERM
    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_REG_ERRNO", str(errno.EOPNOTSUPP))
    assert library.refusal(library.mlx5_reg_dmabuf_mr, None, 0, 0, 0, -1, 0, 0) == errno.EOPNOTSUPP


def test_a_library_without_mlx5_1_25_is_no_data_direct():
    """The distribution's libmlx5 before rdma-core 52 (this machine's, where it is older),
    by its path: in this process the stand-in already answers to the soname."""
    system_library = ctypes.util.find_library("mlx5")
    try:
        system = mlx5dv.Mlx5dv(f"/usr/lib/x86_64-linux-gnu/{system_library}" if system_library else "absent")
    except mlx5dv.Unavailable as error:
        pytest.skip(str(error))
    if system.get_data_direct_sysfs_path is not None:
        pytest.skip("this machine's libmlx5 has MLX5_1.25")
    assert system.refusal(system.mlx5_reg_dmabuf_mr) == errno.EOPNOTSUPP


def test_a_doorbell_page_comes_at_mlx5_1_7_in_nccls_order_and_is_freed(library, monkeypatch):
    """mlx5dv_devx_alloc_uar / _free_uar (MLX5_1.7): flags checked as rdma-core checks them,
    NCCL's order (non-cached dedicated, then non-cached), the register at 0x800 in the page."""
    live = ctypes.CDLL(library.mlx5._name).standin_mlx5_live_uars
    with mlx5dv.alloc_doorbell(library, None) as doorbell:
        assert doorbell.kind == "non-cached dedicated" and doorbell.address % 4096 == 0x800
        assert live() == 1
    assert live() == 0
    alloc, _ = mlx5dv.uar_calls(library)
    ctypes.set_errno(0)
    assert not alloc(None, 0x4) and ctypes.get_errno() == errno.EOPNOTSUPP      # no such type
    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_UAR_ERRNO", str(errno.EPERM))
    with pytest.raises(mlx5dv.NoDoorbell, match="EPERM.*EPERM"):
        mlx5dv.alloc_doorbell(library, None)
    assert live() == 0


@pytest.mark.parametrize("code, stops", [(errno.EIO, True), (errno.EOPNOTSUPP, True), (errno.ENODEV, False)])
def test_a_lookup_error_other_than_enodev_stops_nccl_s_ib_from_2_28_3(library, monkeypatch, code, stops):
    """mlx5dvwrap.cc wrap_mlx5dv_get_data_direct_sysfs_path: ENODEV is "not data-direct",
    any other result stops ncclIbInitDevices from 2.28.3; before, every failure is "not
    data-direct" (issue 39 item 2)."""
    from gdrprobe.nccl import data_direct
    from gdrprobe.nccl.versions import NcclRules

    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_PATH_ERRNO", str(code))
    found, _ = lookup(library)
    probe = data_direct.read_probe({"mlx5": True, "dmabuf_errno": errno.EBADF, "path": None, "errno": found})
    assert probe.path is None
    assert data_direct.breaks_init(NcclRules((2, 28, 3)), {}, probe, nic="mlx5_0") is stops
    assert not data_direct.breaks_init(NcclRules((2, 27, 7)), {}, probe, nic="mlx5_0")
    assert not data_direct.breaks_init(NcclRules(), {"NCCL_IB_DATA_DIRECT": "0"}, probe, nic="mlx5_0")
