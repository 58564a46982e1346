"""Pure helpers of the verbs layer and the device inventory."""

import pytest

from gdrprobe.rdma import verbs
from gdrprobe.rdma.devices import format_guid, gid_type_name
from tests.unit.machine import no_rdma_device_only


def test_guid_is_formatted_like_sysfs():
    # rxe0 on a guest whose node GUID sysfs shows as 5054:00ff:fe00:0001
    assert format_guid(0x010000FEFF005450) == "5054:00ff:fe00:0001"


@pytest.mark.parametrize("gid, address", [
    ("0000:0000:0000:0000:0000:ffff:0a4d:0001", "10.77.0.1"),
    ("fe80:0000:0000:0000:5054:00ff:fe00:0001", "fe80::5054:ff:fe00:1"),
    ("0000:0000:0000:0000:0000:0000:0000:0000", None),
    ("not a gid", None),
])
def test_gid_ip_address(gid, address):
    assert verbs.gid_ip_address(gid) == address


def test_mtu_enum_round_trip():
    assert [verbs.mtu_bytes(v) for v in range(1, 6)] == [256, 512, 1024, 2048, 4096]
    assert verbs.mtu_enum(4096) == 5
    with pytest.raises(ValueError):
        verbs.mtu_enum(1500)


def test_gid_type_names():
    assert gid_type_name(1, verbs.LINK_LAYER_ETHERNET) == "RoCE v2"
    assert gid_type_name(0, verbs.LINK_LAYER_ETHERNET) == "RoCE v1"
    assert gid_type_name(0, 1) == "IB"


@no_rdma_device_only
def test_no_device_on_this_machine_names_the_causes():
    """This machine's kernel has no RDMA: the listing fails with the documented error."""
    from gdrprobe.errors import ExitCode, NoDevice

    with pytest.raises(NoDevice) as caught:
        verbs.device_names()
    assert caught.value.exit_code == ExitCode.NO_DEVICE
    assert "/dev/infiniband" in caught.value.fix
