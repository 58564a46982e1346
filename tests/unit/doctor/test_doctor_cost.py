"""The doctor's cost is linear in ports and devices (issue 43 item 5): one RDMA device with
800 ports took 8.7 s, 3,000 over 25 s, because NCCL's choice of local NICs was asked from
scratch per channel, per GPU, per NIC. Counted, not timed: the Python calls one doctor run
makes, on an eight-GPU node whose first NIC has more and more ports (each port is a
network device to NCCL). benchmarks/doctor_ports.py times it."""

from __future__ import annotations

import sys

from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl.local_choice import LocalSet, Paths
from tests.unit.doctor import nccl_machines


def node_with_ports(root, ports: int):
    tree = nccl_machines.hgx_8gpu_4nic(root)
    for port in range(2, ports + 1):
        for name, value in (("state", "4: ACTIVE"), ("rate", "400 Gb/sec (4X NDR)"),
                            ("link_layer", "InfiniBand")):
            tree.write(f"/sys/class/infiniband/mlx5_0/ports/{port}/{name}", value)
    return tree


def calls_of_one_run(root) -> int:
    counted = [0]

    def count(frame, event, arg):
        if event == "call":
            counted[0] += 1

    sys.setprofile(count)
    try:
        run_doctor(str(root), environ={})
    finally:
        sys.setprofile(None)
    return counted[0]


def test_each_port_more_costs_the_same(tmp_path):
    calls = {}
    for ports in (40, 80, 160):
        node_with_ports(tmp_path / str(ports), ports)
        calls[ports] = calls_of_one_run(tmp_path / str(ports))
    first, second = calls[80] - calls[40], calls[160] - calls[80]
    # Linear: 80 more ports cost twice what 40 more did; quadratic, six times and more.
    assert second < 2.5 * first, calls


class Path:
    def __init__(self, kind: str, bw: float):
        self.type, self.bw = kind, bw


RANK = {"PIX": 4, "PXB": 5, "PHB": 8, "SYS": 9, "PXN": 7}


def test_a_local_set_follows_every_change_as_a_new_computation_would():
    """ncclTopoGetLocal: the highest bandwidth, then the lowest path type, in index order."""
    options = {name: Path("PIX", 24.0) for name in "abcdef"}
    options["c"] = Path("PXB", 24.0)
    kept = LocalSet(options, RANK)
    changes = [("a", Path("PHB", 24.0)), ("c", Path("PIX", 24.0)), ("d", Path("PXN", 48.0)),
               ("d", Path("PHB", 12.0)), ("b", Path("SYS", 6.0)), ("e", Path("PHB", 12.0)),
               ("f", Path("SYS", 6.0)), ("c", Path("SYS", 6.0))]
    for name, path in changes:
        options[name] = path
        kept.changed(name)
        fresh = LocalSet(options, RANK)
        assert (kept.members, kept.best) == (fresh.members, fresh.best), name
        assert [kept.index(key) for key in options] == [fresh.index(key) for key in options]


def test_paths_keep_both_directions_local_sets():
    gpus, nets = ["g0", "g1"], ["n0", "n1", "n2"]
    paths = Paths({g: {n: Path("PIX", 24.0) for n in nets} for g in gpus},
                  {n: {g: Path("PIX", 24.0) for g in gpus} for n in nets}, RANK)
    assert paths.local_nets("g0") == nets and paths.local_gpus("n1") == gpus
    paths.set_to_net("g0", "n1", Path("PHB", 24.0))
    paths.set_to_gpu("n1", "g0", Path("PHB", 24.0))
    assert paths.local_nets("g0") == ["n0", "n2"] and paths.local_net_index("g0", "n2") == 1
    assert paths.local_gpus("n1") == ["g1"] and paths.local_net_index("g0", "n1") is None
