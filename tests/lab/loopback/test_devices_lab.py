"""gdrprobe devices on a real rxe device (one guest, rxe0 on lo)."""

from gdrprobe.rdma import verbs
from tests.lab.helpers import gdrprobe, gdrprobe_json


def test_devices_json_shows_rxe_active_with_roce_v2_gid_for_loopback():
    report = gdrprobe_json("devices")
    assert report["schema_version"] == 1 and report["kind"] == "devices"
    device = {d["name"]: d for d in report["devices"]}["rxe0"]
    port = device["ports"][0]
    assert port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet"
    v2 = {g["ip_address"]: g for g in port["gids"] if g["type"] == "RoCE v2"}
    assert v2["127.0.0.1"]["netdev"] == "lo"


def test_unknown_device_lists_the_names_that_exist():
    done = gdrprobe("devices", "--device", "mlx5_9")
    assert done.returncode == 4
    assert "mlx5_9" in done.stderr and "rxe0" in done.stderr


def test_gid_table_in_one_query_matches_the_slot_by_slot_reading():
    """ibv_query_gid_table and one ibv_query_gid + ibv_query_gid_type per slot agree on
    rxe0's table: index, GID and type."""
    pv = verbs.pyverbs()
    with pv.device.Context(name="rxe0") as ctx:
        ports = ctx.query_device().phys_port_cnt
        attr = ctx.query_port(1)
        in_one_query = verbs.populated_gids(ctx, 1, attr, ports)
        slot_by_slot = verbs._populated_gids_by_slot(ctx, 1, attr)
    assert in_one_query == slot_by_slot
    assert any(gid_type == verbs.ROCE_V2 for _, _, gid_type in in_one_query)
