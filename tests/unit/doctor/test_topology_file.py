"""The doctor on a flat cloud VM whose topology only NCCL's topology file tells (issue 28,
item 1): the file NCCL reads (NCCL_TOPO_FILE from the environment or /etc/nccl.conf, else
/var/run/nvidia-topologyd/virtualTopology.xml; NVIDIA/nccl 2.30.7 src/graph/topo.cc
ncclTopoGetSystem), read under --root and captured, places the GPUs and NICs it names.

Was: every device placed from sysfs, where each sits alone on a root bus: every GPU-NIC
pair PHB, GPUDirect RDMA "off" on every GPU and topology.distance failing, so an engaged A/B
check on such a VM exited 1 and the VM was drained."""

from __future__ import annotations

import os

from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report.model import Status, to_dict
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import cloud_machines
from tests.unit.doctor.stack_machines import DenyingRoot

NICS = [f"mlx5_ib{index}" for index in range(8)]


def by_id(report, finding_id):
    return [finding for finding in report.findings if finding.id == finding_id]


def file_finding(report):
    (finding,) = by_id(report, "topology.nccl_file")
    return finding


def assert_gdr_through_the_files_switches(report):
    """Each GPU shares the file's switch with the NIC NCCL picks for it: PIX, GDR both ways."""
    assert [(d.gpu_bdf, d.nic, d.path_type, d.gdr_write, d.gdr_read) for d in report.nccl] == [
        (gpu, nic, "PIX", True, True) for gpu, nic in zip(cloud_machines.gpus(), NICS)]
    assert {f.status for f in by_id(report, "topology.distance")} == {Status.OK}
    assert [f.id for f in report.findings if f.status is Status.FAIL] == []


def assert_sysfs_answer(report):
    """The answer without the file: every pair PHB across root buses, GDR off."""
    assert {(d.path_type, d.gdr_write, d.gdr_read) for d in report.nccl} == {("PHB", False, False)}
    assert {f.status for f in by_id(report, "topology.distance")} == {Status.FAIL}


def test_the_images_nccl_conf_places_every_gpu_beside_its_nic(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    cloud_machines.install_image_files(tree)
    report = run_doctor(str(tmp_path), environ={})
    assert_gdr_through_the_files_switches(report)
    finding = file_finding(report)
    assert finding.status is Status.OK
    assert finding.summary.startswith("NCCL places GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7, mlx5_ib0")
    assert "/opt/microsoft/ndv5/topo.xml (NCCL_TOPO_FILE in /etc/nccl.conf)" in finding.summary
    evidence = {e.source: e.value for e in finding.evidence}
    assert evidence["/etc/nccl.conf NCCL_TOPO_FILE"] == "'/opt/microsoft/ndv5/topo.xml'"
    # The image's absolute link is followed inside --root, not out of it.
    assert evidence["realpath /opt/microsoft/ndv5/topo.xml"] == "/opt/microsoft/ndv5-topo.xml"
    assert evidence["GPU4 0009:00:00.0"] == "under ffff:ff:05.0, CPU numaid 1 (matched by its bus id 0009:00:00.0)"
    (vm,) = by_id(report, "topology.vm")
    assert vm.status is Status.INFO and "places 16 of them" in vm.summary
    # The decision's JSON names the file too.
    why = to_dict(report)["nccl"][0]["why"]
    assert ("GPU0 (0001:00:00.0) is where NCCL's topology file /opt/microsoft/ndv5/topo.xml (NCCL_TOPO_FILE in "
            "/etc/nccl.conf) puts it: under ffff:ff:01.0, CPU numaid 0 (matched by its bus id 0001:00:00.0)") in why


def test_nccl_topo_file_in_the_environment(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    tree.write("/shared/ndv5.xml", cloud_machines.ndv5_topology())
    report = run_doctor(str(tmp_path), environ={"NCCL_TOPO_FILE": "/shared/ndv5.xml"})
    assert_gdr_through_the_files_switches(report)
    evidence = file_finding(report).evidence
    assert (evidence[0].source, evidence[0].value) == ("environment NCCL_TOPO_FILE", "'/shared/ndv5.xml'")


def test_the_virtual_topology_default_is_read_when_nccl_topo_file_is_unset(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    tree.symlink("/var/run", "/run")
    tree.write("/run/nvidia-topologyd/virtualTopology.xml", cloud_machines.ndv5_topology())
    report = run_doctor(str(tmp_path), environ={})
    assert_gdr_through_the_files_switches(report)
    assert ("/var/run/nvidia-topologyd/virtualTopology.xml (NCCL's default path, NCCL_TOPO_FILE being unset)"
            in file_finding(report).summary)


def test_without_a_file_the_answer_is_sysfs_alone(tmp_path):
    cloud_machines.ndv5_vm(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    assert_sysfs_answer(report)
    finding = file_finding(report)
    assert (finding.status, finding.summary) == (
        Status.INFO, "NCCL detects the topology from sysfs: no NCCL_TOPO_FILE nor "
                     "/var/run/nvidia-topologyd/virtualTopology.xml")
    (vm,) = by_id(report, "topology.vm")
    assert vm.status is Status.WARN and "NCCL_TOPO_FILE" in vm.fix


def test_a_named_file_that_is_missing_is_skipped_and_the_default_not_tried(tmp_path):
    """xml.cc ncclTopoGetXmlFromFile: fopen fails, NCCL logs it and goes on from sysfs; with
    NCCL_TOPO_FILE set, virtualTopology.xml is not read (topo.cc ncclTopoGetSystem)."""
    tree = cloud_machines.ndv5_vm(tmp_path)
    tree.write("/var/run/nvidia-topologyd/virtualTopology.xml", cloud_machines.ndv5_topology())
    report = run_doctor(str(tmp_path), environ={"NCCL_TOPO_FILE": "/opt/microsoft/ndv4-topo.xml"})
    assert_sysfs_answer(report)
    finding = file_finding(report)
    assert finding.status is Status.WARN
    assert finding.summary == (
        "NCCL's topology file /opt/microsoft/ndv4-topo.xml (NCCL_TOPO_FILE in the environment): NCCL cannot open "
        "it (no such file), so it detects every device from sysfs; NCCL says so only at NCCL_DEBUG=INFO "
        "(\"Could not open XML topology file\", INFO from 2.27.3 on)")
    assert any(line.startswith("NCCL's topology file /opt/microsoft/ndv4-topo.xml") for line in report.nccl[0].why)


def test_a_file_nccl_cannot_parse_fails_the_node(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    cloud_machines.install_image_files(tree, '<?xml version="1.0"?>\n' + cloud_machines.ndv5_topology())
    report = run_doctor(str(tmp_path), environ={})
    finding = file_finding(report)
    assert finding.status is Status.FAIL
    assert ("NCCL fails on it (XML Parse : expected >, got '?'): every communicator's init returns "
            "ncclInternalError") in finding.summary
    assert report.exit_code == 1
    assert_sysfs_answer(report)


def test_a_file_for_another_machine_places_nothing(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    other = tuple((gpu + 0x20, nic + 0x20) for gpu, nic in cloud_machines.NDV5_PAIRS)
    cloud_machines.install_image_files(tree, cloud_machines.ndv5_topology(other))
    report = run_doctor(str(tmp_path), environ={})
    assert_sysfs_answer(report)
    finding = file_finding(report)
    assert finding.status is Status.WARN and "names none of this node's GPUs and NICs" in finding.summary
    assert by_id(report, "topology.vm")[0].status is Status.WARN


def test_the_files_link_width_and_speed_replace_sysfs(tmp_path):
    """ncclTopoGetXmlFromSys reads link_speed and link_width from sysfs only where the file
    gives none: Gen4 x8 in the file is 8 x 120 / 80 = 12 GB/s, whatever sysfs says (Gen5 x16)."""
    tree = cloud_machines.ndv5_vm(tmp_path)
    cloud_machines.install_image_files(tree, cloud_machines.ndv5_topology(
        link=('link_speed="16.0 GT/s PCIe"', 'link_width="8"')))
    report = run_doctor(str(tmp_path), environ={})
    assert {d.bandwidth_gbs for d in report.nccl} == {12.0}


def test_gpu_attributes_the_file_fixes_are_named(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    xml = cloud_machines.ndv5_topology().replace(
        '<pci busid="0001:00:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>',
        '<pci busid="0001:00:00.0" class="0x030200"><gpu dev="0" gdr="0"/></pci>')
    cloud_machines.install_image_files(tree, xml)
    finding = file_finding(run_doctor(str(tmp_path), environ={}))
    assert finding.status is Status.WARN and "fixes GPU0 dev=0, GPU0 gdr=0" in finding.summary


def test_a_file_this_user_may_not_read(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    cloud_machines.install_image_files(tree)
    report = run_doctor(sysroot=DenyingRoot(str(tmp_path), {cloud_machines.NDV5_FILE}), environ={})
    assert_sysfs_answer(report)
    finding = file_finding(report)
    assert finding.status is Status.WARN and "this user may not read it" in finding.summary


def test_capture_takes_the_file_and_its_link_and_replays_the_same_decision(tmp_path):
    source, dest = tmp_path / "source", tmp_path / "dest"
    tree = cloud_machines.ndv5_vm(source)
    cloud_machines.install_image_files(tree)
    copied = capture(str(dest), root=str(source), environ={})
    assert {cloud_machines.NDV5_FILE, "/etc/nccl.conf"} <= set(copied)
    assert os.readlink(dest / cloud_machines.NDV5_LINK.lstrip("/")) == cloud_machines.NDV5_FILE
    replayed = DoctorContext(SysRoot(str(dest)), {}).nccl_decisions
    assert [(d.nic, d.path_type, d.gdr_write) for d in replayed] == [(nic, "PIX", True) for nic in NICS]
