"""The command line and the public API are one door: for every command, the flags and the
equivalent call reach the engine with the same settings, memory, endpoint and findings,
and return the same kind of report. The engine's entry points are replaced by recorders;
nothing here opens a device."""

from __future__ import annotations

import pytest

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli import main
from tests.unit.fakes.engine import BUS, FINDINGS, one_gpu_machine

TOKEN = "a-token-of-32-characters-or-more-0123"


def through_cli(engine, argv: list[str], capsys) -> list[tuple]:
    engine.clear()
    code = main(argv)
    capsys.readouterr()
    assert code == 0, argv
    return list(engine)


def through_api(engine, call) -> list[tuple]:
    engine.clear()
    call()
    return list(engine)


@pytest.mark.parametrize("argv, call", [
    (["run", "--loopback"], lambda: gdrprobe.run(loopback=True)),
    (["run", "--loopback", "--latency"], lambda: gdrprobe.run(loopback=True, mode="latency")),
    (["run", "--loopback", "-s", "4096", "-n", "10", "-q", "2"],
     lambda: gdrprobe.run(loopback=True, size=4096, iterations=10, qps=2)),
    (["run", "10.0.0.2", "--token", TOKEN, "-p", "18800"],
     lambda: gdrprobe.run("10.0.0.2", token=TOKEN, port=18800)),
])
def test_a_run_reaches_the_engine_the_same_way(engine, capsys, argv, call):
    assert through_cli(engine, argv, capsys) == through_api(engine, call)


def test_a_gpu_buffer_makes_both_doors_run_the_a_b(engine, capsys):
    cli = through_cli(engine, ["run", "--loopback", "--mem", "gpu"], capsys)
    engine.clear()
    report = gdrprobe.run(loopback=True, mem="gpu")
    assert cli == list(engine)
    assert report.kind == "check" and report.verdict.classification == "engaged"
    options = cli[0][1]
    assert options.sizes == (defaults.A_B_SIZE,)             # the A/B's size, both doors
    assert [call[1].kind for call in cli if call[0] == "probe"] == ["host", "gpu"] * 3


def test_serving_any_memory_is_the_same_through_both_doors(engine, capsys):
    argv = ["serve", "--once", "--token", TOKEN, "--mem", "gpu", "--gpu", "1",
            "--max-buffer", str(64 << 20)]
    cli = through_cli(engine, argv, capsys)
    api = through_api(engine, lambda: gdrprobe.serve(TOKEN, runs=1, mem="gpu", gpu="1",
                                                     max_buffer=64 << 20))
    assert cli == api
    _, token, endpoint, kwargs = cli[0]
    assert kwargs["memory"].kind == "gpu" and kwargs["memory"].gpu == "1"
    assert kwargs["max_buffer"] == 64 << 20 and kwargs["findings"] == FINDINGS
    assert kwargs["port"] == defaults.PORT and cli[1] == ("serve", 1)


def test_the_cluster_is_written_once(engine, capsys):
    cli = through_cli(engine, ["cluster", "--slow-fraction", "0.7"], capsys)
    api = through_api(engine, lambda: gdrprobe.cluster(slow_fraction=0.7))
    assert cli == api == [("cluster", "all", 0.7)]


def test_every_default_the_cli_shows_is_the_table_s(capsys):
    for command, shown in (("run", f"default {defaults.SIZE}"),
                           ("serve", f"default {defaults.MAX_BUFFER >> 20} MiB"),
                           ("check", f"default {defaults.CHECK_TIME_BUDGET_S:g}"),
                           ("cluster", f"default {defaults.SLOW_FRACTION:g}"),
                           ("bench", f"default {defaults.MAX_DROP:g}")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert shown in " ".join(capsys.readouterr().out.split()), command


def test_the_gate_is_the_same_through_both_doors(engine, capsys, monkeypatch):
    one_gpu_machine(monkeypatch, findings=FINDINGS)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cli = through_cli(engine, ["check", "-q"], capsys)
    api = through_api(engine, lambda: gdrprobe.check())
    runs = [call for call in cli if call[0] == "runner"]
    assert len(runs) >= 2 and runs[0][2].device == "mlx5_0"
    assert untimed(cli) == untimed(api)
    # Both doors bound the check by the same budget: windows of a fixed duration.
    assert {call[1].duration_s is not None for call in runs} == {True}


def untimed(calls: list[tuple], *also: str) -> list:
    """The calls without what the clock decides: a budgeted run's time-out is what is left
    of the budget when it starts (and the settings named in also)."""
    import dataclasses

    return [(call[0], {**dataclasses.asdict(call[1]), "timeout_s": None,
                       **dict.fromkeys(also)}, call[2])
            if call[0] == "runner" else call for call in calls]


def test_the_doctor_door_survives_importing_the_doctor_package(tmp_path, capsys):
    import gdrprobe.doctor.runner  # noqa: F401 - binds gdrprobe.doctor to the package

    assert callable(gdrprobe.diagnose)
    for mount_point in ("sys", "proc"):          # a machine's root, if an empty one
        (tmp_path / mount_point).mkdir()
    assert main(["doctor", "--root", str(tmp_path), "--json"]) in (0, 1)
    assert '"kind": "doctor"' in capsys.readouterr().out


def test_qps_floor_and_the_node_check_are_the_same_through_both_doors(engine, capsys,
                                                                      monkeypatch):
    one_gpu_machine(monkeypatch, findings=FINDINGS)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cli = through_cli(engine, ["check", "-q", "4", "--floor", "0", "--quiet"], capsys)
    api = through_api(engine, lambda: gdrprobe.check(qps=4, floor=0))
    assert untimed(cli) == untimed(api)
    runs = [call for call in cli if call[0] == "runner"]
    assert {call[1].qps for call in runs} == {4}
    # GPU memory at both ends of the GPU arm, on the GPU and the NIC NCCL gives it.
    assert [(call[1].kind, call[2].kind) for call in cli if call[0] == "probe"][:2] == [
        ("host", "host"), ("gpu", "gpu")]
    alloc_cli = through_cli(engine, ["check", "--gpu-alloc", "malloc", "--quiet"], capsys)
    assert untimed(alloc_cli) == untimed(through_api(engine,
                                                     lambda: gdrprobe.check(gpu_alloc="malloc")))
    assert {call[1].allocation for call in alloc_cli
            if call[0] == "probe" and call[1].kind == "gpu"} == {"malloc"}
    node_cli = through_cli(engine, ["check", "--node", "--quiet"], capsys)
    node_api = through_api(engine, lambda: gdrprobe.check_node())
    # Each GPU of a node check gets its share of what the budget has left: its windows too.
    assert untimed(node_cli, "duration_s", "warmup_s") == untimed(node_api, "duration_s",
                                                                   "warmup_s")
    assert {call[1].qps for call in node_cli if call[0] == "runner"} == {defaults.CHECK_QPS}


def test_a_size_of_zero_is_refused_not_replaced_by_the_default(engine, capsys):
    with pytest.raises(gdrprobe.errors.UsageError, match="sizes"):
        gdrprobe.run(loopback=True, size=0)
    with pytest.raises(SystemExit) as refused:    # the size parser refuses it at once
        main(["run", "--loopback", "-s", "0"])
    assert refused.value.code == 2 and engine == []


def test_the_gate_registers_as_nccl_does_with_nccls_configuration_files(engine, capsys,
                                                                         monkeypatch):
    """NCCL_IB_PCI_RELAXED_ORDERING=0 from /etc/nccl.conf (the environment as NCCL sees it)
    turns relaxed ordering off for the check's registrations, as NCCL's net_ib does."""
    one_gpu_machine(monkeypatch, nccl_environ={"NCCL_IB_PCI_RELAXED_ORDERING": "0"})
    monkeypatch.delenv("NCCL_IB_PCI_RELAXED_ORDERING", raising=False)
    calls = through_api(engine, lambda: gdrprobe.check())
    assert {call[1].relaxed_ordering for call in calls if call[0] == "runner"} == {False}


@pytest.mark.parametrize("cumem, allocation", [(None, "vmm"), ("0", "malloc"), ("1", "vmm")])
def test_the_gate_allocates_gpu_memory_as_nccl_will(engine, monkeypatch, cumem, allocation):
    """NCCL_CUMEM_ENABLE=0 turns NCCL's cuMem (VMM) allocations off (src/misc/cudawrap.cc
    ncclCuMemEnable); the gate's GPU buffers follow it unless --gpu-alloc says."""
    environ = {} if cumem is None else {"NCCL_CUMEM_ENABLE": cumem}
    one_gpu_machine(monkeypatch, nccl_environ=environ)
    gdrprobe.check()
    probes = [call for call in engine if call[0] == "probe"]
    assert {call[1].allocation for call in probes if call[1].kind == "gpu"} == {allocation}
    engine.clear()
    gdrprobe.check(gpu_alloc="malloc")
    probes = [call for call in engine if call[0] == "probe"]
    assert {call[1].allocation for call in probes if call[1].kind == "gpu"} == {"malloc"}


def test_the_gate_exports_with_the_pcie_mapping_where_nccl_does(engine, monkeypatch):
    """On a C2C system NCCL asks for the PCIe mapping type for a GPU on a PCIe path to its
    NIC (the decision's gdr_mode "pci"): the gate's GPU buffers are exported the same way."""
    from gdrprobe.report.check import NcclUse

    for pcie in (False, True):
        use = NcclUse(gpu=BUS, nic="mlx5_0", path="direct", via_gpu=None, receives=True,
                      sends=True, reasons=(), pcie_mapping=pcie)
        one_gpu_machine(monkeypatch, nccl={BUS: use})
        engine.clear()
        gdrprobe.check()
        gpu_specs = [spec for call in engine if call[0] == "probe" for spec in call[1:]
                     if spec is not None and spec.kind == "gpu"]
        assert gpu_specs and {spec.pcie_mapping for spec in gpu_specs} == {pcie}
