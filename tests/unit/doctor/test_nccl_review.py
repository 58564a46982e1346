"""NCCL rules the doctor got wrong before a review against NVIDIA/nccl 2.30.7's source; each
test names the NCCL file and function it follows and what the doctor answered before."""

from __future__ import annotations

import pytest

from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.checks import nccl_env
from gdrprobe.doctor.facts import pci
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl.decision import Machine
from gdrprobe.nccl.env import conf_assignments, gdr_level, netdevs_policy, parse_hca_filter
from gdrprobe.nccl.topo import inter_cpu_bandwidth, link_bandwidth_gbs, nccl_ports
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines


def context(tmp_path, **environ) -> DoctorContext:
    return DoctorContext(SysRoot(str(tmp_path)), environ)


def nics(tmp_path, **environ) -> dict[str, str | None]:
    return {d.gpu_bdf: d.nic for d in context(tmp_path, **environ).nccl_decisions}


# ---- gpu.dev is NVML's index (src/graph/xml.cc ncclTopoGetXmlFromGpu) -----------------------


def test_channel_nic_starts_from_nvml_index_not_cuda_ordinal(tmp_path):
    """Was: the CUDA ordinal, so CUDA_VISIBLE_DEVICES=1,0 swapped the two GPUs' NICs."""
    tree = nccl_machines.shared_switch(tmp_path)
    nccl_machines.cuda_facts(tree, ["0000:1e:00.0", "0000:1b:00.0"])      # CUDA ordinals reversed
    assert nics(tmp_path) == {"0000:1b:00.0": "mlx5_0", "0000:1e:00.0": "mlx5_1"}


def test_nvml_index_comes_from_nvmls_own_order_where_captured(tmp_path):
    tree = nccl_machines.shared_switch(tmp_path)
    nccl_machines.nvml_facts(tree, ["0000:1e:00.0", "0000:1b:00.0"])
    assert nics(tmp_path) == {"0000:1b:00.0": "mlx5_1", "0000:1e:00.0": "mlx5_0"}


# ---- netsPerGpu and the PXN relay (src/graph/topo.cc ncclTopoGetLocalNetType, ncclTopoGetLocalGpu)


def relay_node(tmp_path):
    """GPUs 1b (NVML 0) and 5b (NVML 2) share a switch with mlx5_0 and mlx5_1; GPU 33 (NVML 1)
    is PHB from both. 0 % 2 == 2 % 2: both switch GPUs start at mlx5_0."""
    return nccl_machines.shared_switch(tmp_path, gpus=("0000:1b:00.0", "0000:5b:00.0"),
                                       elsewhere=("0000:33:00.0",))


def test_auto_policy_leaves_mlx5_1_without_a_relay_gpu(tmp_path):
    """Was: channel % (every local NIC), so GPU 1b relayed mlx5_1 on channel 1 and GPU 33 went
    there through PXN; NCCL (netsPerGpu = DIVUP(2 NICs, 2 GPUs) = 1) never puts a local GPU
    on mlx5_1, so ncclTopoGetLocalGpu returns -1 and GPU 33 uses mlx5_0."""
    relay_node(tmp_path)
    ctx = context(tmp_path)
    machine = Machine(ctx.nccl_node, ctx.environ)
    mlx5_1 = next(n for n in machine.nets if n.label == "mlx5_1")
    assert machine.local_gpu(mlx5_1, machine.start_paths()) is None
    (far,) = [d for d in context(tmp_path).nccl_decisions if d.gpu_bdf == "0000:33:00.0"]
    assert (far.nic, far.path, far.via_gpu, far.candidates) == ("mlx5_0", "pxn", "0000:1b:00.0", ("mlx5_0",))


@pytest.mark.parametrize("policy", ["ALL", "all", "MAX:2"])
def test_all_and_max_policies_spread_the_switch_gpus_over_both_nics(tmp_path, policy):
    relay_node(tmp_path)
    (far,) = [d for d in context(tmp_path, NCCL_NETDEVS_POLICY=policy).nccl_decisions
              if d.gpu_bdf == "0000:33:00.0"]
    assert (far.nic, far.candidates) == ("mlx5_1", ("mlx5_0", "mlx5_1"))


@pytest.mark.parametrize("raw, kind, limit, recognised", [
    (None, "AUTO", 0, True), ("Auto", "AUTO", 0, True), ("max:3", "MAX", 3, True),
    ("MAX:0", "AUTO", 0, False), ("MAX:x", "AUTO", 0, False), ("most", "AUTO", 0, False)])
def test_netdevs_policy_is_parsed_as_nccl_does(raw, kind, limit, recognised):
    policy = netdevs_policy({} if raw is None else {"NCCL_NETDEVS_POLICY": raw})
    assert (policy.kind, policy.limit, policy.recognised) == (kind, limit, recognised)
    assert policy.nets_per_gpu(3, 2) == {"AUTO": 2, "MAX": 3}[kind]


def test_unrecognised_netdevs_policy_warns_that_nccl_uses_auto(tmp_path):
    nccl_machines.pix_and_pxb(tmp_path)
    found = {f.id: f for f in nccl_env.check(context(tmp_path, NCCL_NETDEVS_POLICY="MAX:0"))}
    assert found["nccl.netdevs_policy"].status is Status.WARN and "uses AUTO" in found["nccl.netdevs_policy"].summary
    assert "nccl.netdevs_policy" not in {f.id for f in nccl_env.check(context(tmp_path, NCCL_NETDEVS_POLICY="max:2"))}


# ---- NCCL_PXN_DISABLE == 1 only (src/graph/paths.cc ncclTopoComputePaths) ----------------------


@pytest.mark.parametrize("value, reported", [("1", True), ("0x1", True), ("2", False), ("-1", False)])
def test_pxn_disable_is_reported_only_when_nccl_disables_pxn(tmp_path, value, reported):
    """Was: any non-zero value reported as disabling PXN while the decision kept PXN."""
    nccl_machines.hgx_8gpu_4nic(tmp_path)
    ctx = context(tmp_path, NCCL_PXN_DISABLE=value)
    found = {f.id for f in nccl_env.check(ctx)}
    assert ("nccl.pxn_disable" in found) is reported
    assert (ctx.nccl_decisions[1].path == "pxn") is not reported


# ---- NCCL_NET_GDR_LEVEL in a C int (src/graph/paths.cc ncclGetLevel) --------------------------


@pytest.mark.parametrize("raw, name, undefined", [
    ("4294967296", "LOC", False),             # 2^32 -> int 0
    ("4294967298", "PXB", False),             # 2^32 + 2 -> int 2
    ("4294967295", "P2C", True),              # -> int -1: levelsOldToNew[-1]
    ("2147483648", "P2C", True),              # -> INT_MIN
    ("99999999999999999999", "P2C", True),    # strtol saturates at LONG_MAX -> int -1
    ("2147483647", "SYS", False)])
def test_gdr_level_number_is_truncated_to_a_c_int(raw, name, undefined):
    """Was: any large number clamped to SYS."""
    level = gdr_level({"NCCL_NET_GDR_LEVEL": raw})
    assert (level.name, level.undefined, level.ignored) == (name, undefined, False)


def test_undefined_gdr_level_is_a_warning_that_says_so(tmp_path):
    nccl_machines.pix_and_pxb(tmp_path)
    ctx = context(tmp_path, NCCL_NET_GDR_LEVEL="4294967295")
    (level,) = [f for f in nccl_env.check(ctx) if f.id == "nccl.net_gdr_level"]
    assert level.status is Status.WARN and "undefined behaviour" in level.summary
    assert any("is undefined in NCCL, default assumed" in why for why in ctx.nccl_decisions[0].why)


# ---- NCCL_IB_HCA ports and empty lists (src/misc/utils.cc parseStringList, matchIfList) -------


@pytest.mark.parametrize("value, device, ports, selected", [
    ("^", "mlx5_0", (1,), False),              # an empty exclusion list excludes everything
    ("^=", "mlx5_0", (1,), False),
    ("=", "mlx5_0", (1,), True),
    ("mlx5_0:2", "mlx5_0", (1,), False),       # the port must match
    ("mlx5_0:2", "mlx5_0", (1, 2), True),
    ("^mlx5_0:1", "mlx5_0", (1, 2), True),     # port 2 stays
    ("mlx5_0:", "mlx5_0", (1,), True),         # an empty port is any port
    ("mlx5_0:x", "mlx5_0", (1,), False),       # atoi("x") = 0, no port 0
    (" mlx5_0", "mlx5_0", (1,), False),        # no trimming
    (",,mlx5_0", "mlx5_0", (1,), True)])
def test_ib_hca_matches_ports_as_nccl_does(value, device, ports, selected):
    assert parse_hca_filter(value).selects(device, ports) is selected


def test_ib_hca_caret_alone_leaves_nccl_no_nic(tmp_path):
    """Was: "^" read as "exclude nothing", every GPU kept its NIC."""
    nccl_machines.pix_and_pxb(tmp_path)
    assert set(nics(tmp_path, NCCL_IB_HCA="^").values()) == {None}


def test_ib_hca_port_that_is_not_the_active_one_drops_the_nic(tmp_path):
    nccl_machines.pix_and_pxb(tmp_path)
    assert nics(tmp_path, NCCL_IB_HCA="mlx5_0:2,mlx5_1:1") == {"0000:1b:00.0": "mlx5_1",
                                                               "0000:9d:00.0": "mlx5_1"}


# ---- PCIe link speed (src/graph/xml.cc: unparseable speed is FLT_MAX) -------------------------


@pytest.mark.parametrize("device, port, gbs", [
    ("Unknown", "32.0 GT/s PCIe", 48.0),       # the port's speed wins
    ("32.0 GT/s PCIe", "", 48.0),
    ("Unknown", "Unknown", 12.0),              # neither: NCCL's Gen3 fallback
    ("16.0 GT/s PCIe", "32.0 GT/s PCIe", 24.0)])
def test_unreadable_link_speed_lets_the_other_side_win(tmp_path, device, port, gbs):
    """Was: "Unknown" became Gen3 before the minimum: 12 GB/s for a Gen5 x16 link."""
    tree = nccl_machines.pix_pairs(tmp_path)
    gpu = "0000:1b:00.0"
    parent = tree.devices[gpu].rsplit("/", 1)[0]
    tree.write(f"{tree.devices[gpu]}/max_link_speed", device + "\n")
    tree.write(f"{parent}/max_link_speed", port + "\n")
    assert link_bandwidth_gbs(pci.pcie_link(SysRoot(str(tmp_path)), gpu)) == gbs


# ---- port rate per port (src/transport/net_ib/init.cc, src/graph/topo.cc ncclTopoAddNet) ------


def two_port_nic(tmp_path):
    """mlx5_0's port 1 is down at 400 Gb/s, port 2 active at 100 Gb/s."""
    tree = nccl_machines.pix_pairs(tmp_path)
    nccl_machines.port_rate(tree, "mlx5_0", 100, port=2)
    tree.write("/sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n")
    return tree


def test_nic_bandwidth_is_the_active_ports_rate(tmp_path):
    """Was: the first port with a rate (400 Gb/s, down): 48 GB/s, so GPU0 kept mlx5_0; at
    100 Gb/s NCCL takes the farther 400 Gb/s mlx5_1 (bandwidth first)."""
    two_port_nic(tmp_path)
    first = context(tmp_path).nccl_decisions[0]
    assert (first.nic, first.bandwidth_gbs) == ("mlx5_1", 48.0)
    only = context(tmp_path, NCCL_IB_HCA="=mlx5_0").nccl_decisions[0]
    assert (only.nic, only.bandwidth_gbs) == ("mlx5_0", 12.5)


def test_each_active_port_is_its_own_nic_to_nccl(tmp_path):
    """Was: one NIC per PCI function, so both GPUs under the switch shared mlx5_0's first port.
    With NIC fusion off (NCCL_NET_MERGE_LEVEL=LOC; before 2.24.3 there was none) each port is
    its own network device; by default they fuse (test_nic_fusion.py)."""
    tree = nccl_machines.shared_switch(tmp_path, nics=1)
    nccl_machines.port_rate(tree, "mlx5_0", 400, port=2)
    first, second = context(tmp_path, NCCL_NET_MERGE_LEVEL="LOC").nccl_decisions
    assert first.candidates == second.candidates == ("mlx5_0:1", "mlx5_0:2")
    assert (first.nic, second.nic) == ("mlx5_0", "mlx5_0")
    assert first.why[0].startswith("mlx5_0:1 has") and second.why[0].startswith("mlx5_0:2 has")
    port_2 = context(tmp_path, NCCL_IB_HCA="mlx5_0:2", NCCL_NET_MERGE_LEVEL="LOC")
    (only,) = {d.candidates for d in port_2.nccl_decisions}
    assert only == ("mlx5_0",)


def test_port_without_a_speed_counts_as_10_gbps(tmp_path):
    tree = two_port_nic(tmp_path)
    tree.write("/sys/class/infiniband/mlx5_0/ports/2/rate", "0 Gb/sec\n")
    ports = pci.rdma_ports(SysRoot(str(tmp_path)), "mlx5_0")
    assert [p.nccl_gbps for p in nccl_ports("mlx5_0", ports)] == [10.0]


# ---- inter-socket bandwidth (src/graph/topo.cc ncclTopoGetInterCpuBw, topo.h) ----------------


@pytest.mark.parametrize("cpuinfo, gbs, assumed", [
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n", 40.0, False),   # Emerald Rapids
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n", 22.0, False),   # Sapphire Rapids
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n", 10.0, False),    # Skylake
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 79\n", 6.0, False),     # Broadwell
    ("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n", 16.0, False),
    ("vendor_id\t:   Shanghai  \ncpu family\t: 7\nmodel\t\t: 91\n", 9.0, False),     # Yongfeng
    ("vendor_id\t: CentaurHauls\ncpu family\t: 6\nmodel\t\t: 15\n", 6.0, False),
    ("vendor_id\t: HygonGenuine\ncpu family\t: 24\nmodel\t\t: 2\n", 5000.0, False),  # unknown: LOC_BW
    ("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n", 6.0, False),
    ("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n", 32.0, False),
    ("", 6.0, True)])
def test_inter_cpu_bandwidth_follows_nccls_table(cpuinfo, gbs, assumed):
    """Was: every Intel CPU 10 GB/s, anything unknown 6 GB/s without saying it was assumed."""
    found = inter_cpu_bandwidth(cpuinfo)
    assert (found.gbs, found.assumed) == (gbs, assumed)


def test_cross_socket_nic_is_capped_by_the_cpus_link_and_the_why_says_so(tmp_path):
    tree = nccl_machines.pix_and_pxb(tmp_path)
    nccl_machines.cpu(tree, "GenuineIntel", 6, 143)
    first = context(tmp_path, NCCL_IB_HCA="=mlx5_1").nccl_decisions[0]
    assert (first.nic, first.path_type, first.bandwidth_gbs) == ("mlx5_1", "SYS", 22.0)
    assert ("across sockets NCCL counts 22 GB/s (topo.cc ncclTopoGetInterCpuBw): GenuineIntel family 6 "
            "model 0x8f (/proc/cpuinfo)") in first.why
    tree.write("/proc/cpuinfo", "processor\t: 0\n")
    unknown = context(tmp_path, NCCL_IB_HCA="=mlx5_1").nccl_decisions[0]
    assert any("6 GB/s assumed" in why for why in unknown.why)


# ---- NCCL's configuration files (src/misc/param.cc initEnvFunc, setEnvFile) ------------------


def test_conf_file_lines_are_read_as_setenvfile_reads_them():
    text = "# comment\nNCCL_A=1\r\nNCCL_B = 2\nno equals\n=x\nNCCL_A=3\nNCCL_C=a=b"
    assert conf_assignments(text) == [("NCCL_A", "1"), ("NCCL_B ", " 2"), ("NCCL_A", "3"), ("NCCL_C", "a=b")]


def test_conf_files_merge_under_the_environment_with_their_source(tmp_path):
    """Was: /etc/nccl.conf and ~/.nccl.conf ignored, so NCCL_IB_DISABLE=1 there went unseen."""
    tree = nccl_machines.pix_and_pxb(tmp_path)
    tree.write("/home/u/.nccl.conf", "NCCL_IB_DISABLE=1\nNCCL_DEBUG=WARN\n")
    tree.write("/etc/nccl.conf", "NCCL_IB_DISABLE=0\nNCCL_DEBUG=INFO\nNCCL_NET_GDR_READ=0\n")
    ctx = context(tmp_path, HOME="/home/u", NCCL_DEBUG="TRACE")
    assert {k: (ctx.environ[k], ctx.environ_source(k)) for k in ("NCCL_IB_DISABLE", "NCCL_DEBUG",
                                                                 "NCCL_NET_GDR_READ")} == {
        "NCCL_IB_DISABLE": ("1", "/home/u/.nccl.conf"), "NCCL_DEBUG": ("TRACE", "environment"),
        "NCCL_NET_GDR_READ": ("0", "/etc/nccl.conf")}
    found = {f.id: f for f in nccl_env.check(ctx)}
    assert found["nccl.ib_disable"].status is Status.FAIL
    assert found["nccl.ib_disable"].evidence[0].source == "/home/u/.nccl.conf NCCL_IB_DISABLE"


def test_nccl_conf_file_replaces_the_home_file(tmp_path):
    tree = nccl_machines.pix_and_pxb(tmp_path)
    tree.write("/home/u/.nccl.conf", "NCCL_IB_DISABLE=1\n")
    tree.write("/opt/job.conf", "NCCL_NET_GDR_READ=0\n")
    ctx = context(tmp_path, HOME="/home/u", NCCL_CONF_FILE="/opt/job.conf")
    assert "NCCL_IB_DISABLE" not in ctx.environ
    assert ctx.environ_source("NCCL_NET_GDR_READ") == "/opt/job.conf"


def test_capture_copies_the_conf_files_and_replay_reads_them(tmp_path):
    tree = nccl_machines.pix_and_pxb(tmp_path / "node")
    tree.write("/home/u/.nccl.conf", "NCCL_IB_DISABLE=1\n")
    tree.write("/etc/nccl.conf", "NCCL_NET_GDR_READ=0\n")
    capture(str(tmp_path / "copy"), root=str(tmp_path / "node"), environ={"HOME": "/home/u"})
    assert (tmp_path / "copy/etc/nccl.conf").read_text() == "NCCL_NET_GDR_READ=0\n"
    replay = {f.id: f for f in run_doctor(str(tmp_path / "copy")).findings}
    assert replay["nccl.ib_disable"].evidence[0].source == "/home/u/.nccl.conf NCCL_IB_DISABLE"
    assert replay["nccl.net_gdr_read"].evidence[0].source == "/etc/nccl.conf NCCL_NET_GDR_READ"
