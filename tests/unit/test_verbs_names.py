"""Pure helpers of the verbs layer and the device inventory."""

import pytest

from gdrprobe.rdma import verbs
from gdrprobe.rdma.devices import format_guid
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


class TableEntry:
    """One ibv_gid_entry as pyverbs' GIDEntry shows it."""

    def __init__(self, port_num, gid_index, gid, gid_type):
        self.port_num, self.gid_index, self._gid, self.gid_type = (
            port_num, gid_index, gid, gid_type)

    def gid_str(self):
        return self._gid


V4 = "0000:0000:0000:0000:0000:ffff:7f00:0001"
LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe00:0001"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


class PortAttr:
    gid_tbl_len = 1024
    link_layer = verbs.LINK_LAYER_ETHERNET


class TableContext:
    """A device context whose GID table holds two ports' entries, out of order."""

    def __init__(self):
        self.asked = None

    def query_gid_table(self, max_entries):
        self.asked = max_entries
        return [TableEntry(1, 1, V4, 2), TableEntry(2, 0, LINK_LOCAL, 0),
                TableEntry(1, 0, LINK_LOCAL, 1), TableEntry(1, 7, ZERO, 2)]


def test_gid_table_is_one_query_with_room_for_every_port():
    ctx = TableContext()
    assert verbs.populated_gids(ctx, 1, PortAttr(), port_count=2) == [
        (0, LINK_LOCAL, "RoCE v1"), (1, V4, "RoCE v2")]
    assert ctx.asked == 2048


class SlotContext:
    """pyverbs before rdma-core 32: no query_gid_table, one slot per query."""

    slots = {0: LINK_LOCAL, 1: V4}
    sysfs_types = {0: 0, 1: verbs.GID_TYPE_SYSFS_ROCE_V2}

    def query_gid(self, port, index):
        return type("GID", (), {"gid": self.slots.get(index, ZERO)})

    def query_gid_type(self, port, index):
        return self.sysfs_types[index]


def test_gid_table_slot_by_slot_where_pyverbs_is_older():
    assert verbs.populated_gids(SlotContext(), 1, PortAttr(), port_count=1) == [
        (0, LINK_LOCAL, "RoCE v1"), (1, V4, "RoCE v2")]


@pytest.mark.parametrize("gid, zero", [(ZERO, True), (V4, False), (LINK_LOCAL, False)])
def test_zero_gid(gid, zero):
    assert verbs.is_zero_gid(gid) is zero


@no_rdma_device_only
def test_no_device_on_this_machine_names_the_causes():
    """This machine's kernel has no RDMA: the listing fails with the documented error."""
    from gdrprobe.errors import ExitCode, NoDevice

    with pytest.raises(NoDevice) as caught:
        verbs.device_names()
    assert caught.value.exit_code == ExitCode.NO_DEVICE
    assert "/dev/infiniband" in caught.value.fix
