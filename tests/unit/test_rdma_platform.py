"""The verbs platform as NCCL meets it, on fixtures: the GID the endpoint takes on a RoCE port
(an IPv6-only one included; NCCL's walk itself: test_nccl_gid.py), the devices a process can
open, a device open that is refused, and the XDR speed that only active_speed_ex carries. The
lab runs the same against rxe."""

from __future__ import annotations

import errno
import os
import types

import pytest

from gdrprobe.errors import ExitCode, NoDevice, RdmaError
from gdrprobe.nccl import gid as nccl_gid
from gdrprobe.rdma import devices, endpoint, verbs
from gdrprobe.sysroot import SysRoot
from tests.unit.fakes.gids import DUAL_STACK, IPV6_ONLY, LINK_LOCAL, V1, V2, V4_A



class GidContext:
    def __init__(self, table):
        self.table = table

    def query_gid_table(self, max_entries):
        return [types.SimpleNamespace(port_num=1, gid_index=index, gid_str=lambda g=gid: g,
                                      gid_type={V1: 1, V2: 2}[kind])
                for index, gid, kind in self.table]

    def query_gid(self, port, index):
        return types.SimpleNamespace(gid=dict((i, g) for i, g, _ in self.table).get(
            index, nccl_gid.ZERO_GID))


ROCE_PORT = types.SimpleNamespace(gid_tbl_len=256, link_layer=verbs.LINK_LAYER_ETHERNET)


def choose(table, local_ip):
    return endpoint.choose_gid(GidContext(table), 1, ROCE_PORT, 1, local_ip, None, "rxe0")


def test_an_ipv6_only_port_works_in_loopback_with_nccls_gid():
    index, gid, why = choose(IPV6_ONLY, None)
    assert (index, gid) == (0, LINK_LOCAL)
    assert "the GID NCCL picks" in why and "index 0, RoCE v1" in why


def test_a_remote_run_takes_the_gid_of_its_out_of_band_address():
    assert choose(DUAL_STACK, "10.77.0.1")[:2] == (3, V4_A)


def test_an_out_of_band_address_without_a_gid_falls_to_nccls_choice_and_says_so():
    index, _, why = choose(DUAL_STACK, "172.16.0.9")
    assert index == 3 and "172.16.0.9, the out-of-band address, has no RoCE v2 GID" in why


def test_an_empty_gid_table_is_no_usable_gid():
    with pytest.raises(NoDevice, match="no usable GID") as raised:
        choose([], None)
    assert raised.value.exit_code == ExitCode.NO_DEVICE


# ---- XDR -----------------------------------------------------------------------------------


def test_xdr_speed_comes_from_active_speed_ex():
    xdr_4x = types.SimpleNamespace(active_speed=0, active_speed_ex=256, active_width=2)
    assert verbs.port_speed(xdr_4x) == 256 and verbs.port_rate_gbps(xdr_4x) == 800.0
    ndr_4x = types.SimpleNamespace(active_speed=128, active_width=2)   # pyverbs before 49
    assert verbs.port_rate_gbps(ndr_4x) == 400.0
    hdr_ex_zero = types.SimpleNamespace(active_speed=64, active_speed_ex=0, active_width=2)
    assert verbs.port_rate_gbps(hdr_ex_zero) == 200.0


# ---- which devices can be opened (libibverbs init.c, NCCL ncclIbInitDevices) --------------


def machine(tmp_path, nodes: dict[str, str], present=()):
    """A root whose /sys/class/infiniband_verbs maps uverbsN -> device, and whose
    /dev/infiniband holds the `present` nodes as plain files."""
    for node, device in nodes.items():
        entry = tmp_path / "sys/class/infiniband_verbs" / node
        entry.mkdir(parents=True)
        (entry / "ibdev").write_text(device + "\n")
    dev = tmp_path / "dev/infiniband"
    dev.mkdir(parents=True)
    for node in present:
        (dev / node).write_text("")
    return SysRoot(str(tmp_path))


def test_a_device_whose_node_opens_is_openable(tmp_path):
    root = machine(tmp_path, {"uverbs0": "mlx5_0"}, present=["uverbs0"])
    assert devices.verbs_node("mlx5_0", root) == "uverbs0"
    assert devices.open_refusal("mlx5_0", root) is None


def test_a_missing_node_or_entry_is_refused_with_why(tmp_path):
    root = machine(tmp_path, {"uverbs0": "mlx5_0"})
    code, why = devices.open_refusal("mlx5_0", root)
    assert code == errno.ENOENT and why.startswith("/dev/infiniband/uverbs0: ")
    assert devices.open_refusal("mlx5_9", root)[0] == errno.ENODEV


def test_the_first_openable_device_is_chosen_and_the_skipped_ones_said(tmp_path, monkeypatch):
    root = machine(tmp_path, {"uverbs0": "mlx5_0", "uverbs1": "mlx5_1"}, present=["uverbs1"])
    monkeypatch.setattr(verbs, "device_names", lambda: ["mlx5_0", "mlx5_1"])
    name, notes = devices.choose_device(None, root)
    assert name == "mlx5_1"
    assert notes == ("mlx5_0 skipped: /dev/infiniband/uverbs0: No such file or directory",)
    assert devices.choose_device("mlx5_0", root) == ("mlx5_0", ())   # named: as asked


def test_no_openable_device_is_no_device_with_each_reason(tmp_path, monkeypatch):
    root = machine(tmp_path, {"uverbs0": "mlx5_0"})
    monkeypatch.setattr(verbs, "device_names", lambda: ["mlx5_0"])
    with pytest.raises(NoDevice, match="no RDMA device can be opened") as raised:
        devices.choose_device(None, root)
    assert "mlx5_0 skipped" in raised.value.evidence and "container" in raised.value.fix


def test_a_refused_open_names_the_node_the_errno_and_the_fix(tmp_path, monkeypatch):
    root = machine(tmp_path, {"uverbs0": "mlx5_0"}, present=["uverbs0"])

    def refuse(path):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)

    monkeypatch.setattr(root, "try_open_device", refuse)
    code, why = devices.open_refusal("mlx5_0", root)
    error = devices.open_failed("mlx5_0", code, why)
    assert error.exit_code == ExitCode.NO_DEVICE
    assert error.cause == ("RDMA device mlx5_0 cannot be opened (/dev/infiniband/uverbs0: "
                           "Operation not permitted)")
    assert "cgroup" in error.fix


# ---- the endpoint's own pyverbs calls --------------------------------------------------------


class FakeVerbsError(Exception):
    def __init__(self, text, code=-1):
        super().__init__(text)
        self.error_code = code


def fake_pv(context):
    return types.SimpleNamespace(PyverbsError=FakeVerbsError,
                                 device=types.SimpleNamespace(Context=context))


def bare_endpoint(device="rxe0"):
    ep = endpoint.Endpoint.__new__(endpoint.Endpoint)
    ep.device, ep.objects, ep.qps = device, [], []
    return ep


def test_a_device_open_pyverbs_refuses_is_a_named_error_not_a_traceback(monkeypatch):
    monkeypatch.setattr(endpoint, "open_refusal", lambda device: (errno.ENXIO, "uverbs0: gone"))

    def refuse(name):
        raise FakeVerbsError("Failed to open device", errno.ENXIO)

    with pytest.raises(NoDevice) as raised:
        bare_endpoint()._open_context(fake_pv(refuse))
    assert raised.value.cause == "RDMA device rxe0 cannot be opened (uverbs0: gone)"
    assert raised.value.exit_code == ExitCode.NO_DEVICE


def test_a_refused_open_whose_node_opens_keeps_pyverbs_reason(monkeypatch):
    monkeypatch.setattr(endpoint, "open_refusal", lambda device: None)

    def refuse(name):
        raise FakeVerbsError("Failed to open device. Errno: 25, Inappropriate ioctl", 25)

    with pytest.raises(NoDevice, match="Inappropriate ioctl"):
        bare_endpoint()._open_context(fake_pv(refuse))


def test_a_failing_verbs_step_names_the_step():
    def fail():
        raise FakeVerbsError("Failed to alloc PD. Errno: 12, Cannot allocate memory", 12)

    with pytest.raises(RdmaError, match="allocating a protection domain on rxe0 failed") as raised:
        bare_endpoint()._verbs(fake_pv(None), "allocating a protection domain", fail)
    assert "Cannot allocate memory" in raised.value.evidence


# ---- the doctor's NICs for NCCL's decision: only those NCCL can open ----------------------


def verbs_nodes(root, present: tuple[str, ...]) -> None:
    """mlx5_k behind uverbsk in sysfs; /dev/infiniband holds the `present` nodes."""
    for k in range(2):
        entry = root / f"sys/class/infiniband_verbs/uverbs{k}"
        entry.mkdir(parents=True)
        (entry / "ibdev").write_text(f"mlx5_{k}\n")
    (root / "dev/infiniband").mkdir(parents=True)
    for node in present:
        (root / "dev/infiniband" / node).write_text("")


def nccl_nics(root) -> list:
    from gdrprobe.doctor.facts.context import DoctorContext

    return [d.nic for d in DoctorContext(SysRoot(str(root)), {}).nccl_decisions]


def test_nccls_nic_is_chosen_among_the_nics_this_process_can_open(tmp_path):
    from gdrprobe.doctor.checks import nic as nic_checks
    from gdrprobe.doctor.facts.context import DoctorContext
    from tests.unit.doctor import nccl_machines

    both, one = tmp_path / "both", tmp_path / "one"
    for root, present in ((both, ("uverbs0", "uverbs1")), (one, ("uverbs1",))):
        nccl_machines.shared_switch(root, nics=2)
        verbs_nodes(root, present)
    assert nccl_nics(both)[0] == "mlx5_0"
    assert nccl_nics(one) == ["mlx5_1", "mlx5_1"]           # mlx5_0 cannot be opened here
    ctx = DoctorContext(SysRoot(str(one)), {})
    assert ctx.unopenable_nics == {
        "mlx5_0": "/dev/infiniband/uverbs0: No such file or directory"}
    nodes = next(f for f in nic_checks.check(ctx) if f.id == "nic.dev_infiniband")
    assert "mlx5_0" in nodes.summary and nodes.status.value == "fail"


def test_a_nic_whose_verbs_node_sysfs_does_not_name_stays_a_candidate(tmp_path):
    from tests.unit.doctor import nccl_machines

    nccl_machines.shared_switch(tmp_path, nics=2)          # no infiniband_verbs entries at all
    assert nccl_nics(tmp_path)[0] == "mlx5_0"


def test_a_peer_with_another_qp_count_is_the_peers_not_a_failed_verbs_call(monkeypatch):
    """Both ends build their QPs from one run's options: a peer that did not is a peer
    error (5, warn), never the drain of a failed verbs call (6)."""
    from gdrprobe.errors import PeerError
    from gdrprobe.rdma import endpoint, verbs as verbs_module

    monkeypatch.setattr(verbs_module, "pyverbs", lambda: None)
    side = object.__new__(endpoint.Endpoint)
    side.qps = [object(), object()]
    peer = endpoint.EndpointAddress("fe80::1", 0, 0, 4096, qp_numbers=(7,), psns=(1,))
    with pytest.raises(PeerError, match="the peer has 1 QPs, this side 2") as raised:
        side.connect(peer)
    assert raised.value.exit_code == ExitCode.PEER
