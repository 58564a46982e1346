"""Recorders in place of gdrprobe's engine (the run engine, the server, the machine's facts
and MPI), under the real public API: what the two doors and the API's documented examples
run against. Nothing opens a device."""

from __future__ import annotations

import types

from tests.unit.fakes.runs import fake_probe

FINDINGS = ("a finding of this host",)
BUS = "0000:3b:00.0"


def one_nic():
    """The DeviceReport of a node with one RDMA NIC, mlx5_0, its port ACTIVE at 400 Gb/s."""
    from gdrprobe.report.model import DeviceInfo, DeviceReport, PortInfo

    port = PortInfo(port=1, state="ACTIVE", physical_state="LINK_UP", link_layer="InfiniBand",
                    active_mtu_bytes=4096, max_mtu_bytes=4096, active_speed="100.0 Gbps",
                    active_width="4X", rate_gbps=400.0, lid=1, gids=())
    return DeviceReport(devices=(DeviceInfo("mlx5_0", "0000:0000:0000:0001", "InfiniBand",
                                            "CA", "28.39.1002", 0x02C9, 0x1021, (port,)),))


def install_engine(monkeypatch, tmp_path) -> list[tuple]:
    """The recorders installed; returns the calls they record. The A/B's prerequisites (an
    RDMA device, the CUDA driver) are met."""
    from gdrprobe.campaign import cluster, machine
    from gdrprobe.campaign.gate import GpuFacts, MachineFacts
    from gdrprobe.measure import loopback, server
    from gdrprobe.memory import cuda_driver
    from gdrprobe.nccl.versions import NcclRules
    from gdrprobe.rdma import devices, verbs

    calls: list[tuple] = []
    run_once, _ = fake_probe(gpu_gbps=97.0)
    monkeypatch.setenv("GDRPROBE_LOCK_DIR", str(tmp_path))   # check's NIC lock files

    def runner(options, endpoint, host=None, port=None, token=None, connect_wait_s=0.0,
               on_result=None, notice=None, **more):
        calls.append(("runner", options, endpoint, host, port, token, connect_wait_s))

        def probe(local, remote):
            calls.append(("probe", local, remote))
            return run_once(local, remote)
        return probe

    class Server:
        port = 18750

        def __init__(self, token, endpoint, **kwargs):
            calls.append(("server", token, endpoint, kwargs))

        def serve(self, runs=None):
            calls.append(("serve", runs))

        def close(self):
            pass

    def run_cluster(comm, pattern, serve, find_address, measure, slow_fraction):
        calls.append(("cluster", pattern, slow_fraction))
        return None

    monkeypatch.setattr(loopback, "runner", runner)
    monkeypatch.setattr(verbs, "devices", lambda: {"mlx5_0": None})
    monkeypatch.setattr(devices, "list_devices", lambda device=None, root="/": one_nic())
    monkeypatch.setattr(cuda_driver, "require_driver_library", lambda: None)
    monkeypatch.setattr(server, "ProbeServer", Server)
    monkeypatch.setattr(machine, "run_facts", lambda local, loopback: MachineFacts(
        GpuFacts(None, ()), {}, findings=FINDINGS) if local.kind == "gpu" else None)
    monkeypatch.setattr(machine, "nccl_view", lambda: ({}, NcclRules()))
    monkeypatch.setattr(machine, "served_findings", lambda: FINDINGS)
    monkeypatch.setattr(cluster, "world", lambda: types.SimpleNamespace())
    monkeypatch.setattr(cluster, "run_cluster", run_cluster)
    monkeypatch.setattr(cluster, "pair_probe", lambda *args: ("pair_probe", *args))
    return calls


def one_gpu_machine(monkeypatch, **facts) -> None:
    """machine_facts() answers one GPU (BUS) and the NIC NCCL gives it, with these facts."""
    from gdrprobe.campaign import machine
    from gdrprobe.campaign.gate import GpuFacts, MachineFacts, NicChoice

    found = MachineFacts(GpuFacts((BUS,), (BUS,)), {BUS: NicChoice("mlx5_0", "NCCL's")},
                         **facts)
    monkeypatch.setattr(machine, "machine_facts", lambda **_: found)
