"""The NCCL the job will load, found without loading it (gdrprobe/doctor/facts/nccl_library.py),
and the rules of its release (gdrprobe/nccl/versions.py, each from the NVIDIA/nccl tag that
introduced it). Was: no such finding; every decision by 2.30.7's rules."""

from __future__ import annotations

import json

import pytest

from gdrprobe.cli import main
from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.facts import nccl_library
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines, nccl_machines
from tests.unit.doctor.nccl_libraries import built_library, ld_so_cache, library_bytes, wheel

VENV_SITE = "/opt/venv/lib/python3.11/site-packages"


def library(tmp_path, environ=None, nccl=None, this_python=()):
    """The library found under a root, with what a capture says of the interpreter that ran."""
    (tmp_path / "gdrprobe-capture").mkdir(exist_ok=True)
    (tmp_path / "gdrprobe-capture/nccl.json").write_text(json.dumps({"site_packages": list(this_python)}))
    return DoctorContext(SysRoot(str(tmp_path)), environ or {}, nccl).nccl_library


def findings(report):
    return {f.id: f for f in report.findings}


# ---- where it is found ---------------------------------------------------------------------


def test_the_wheel_of_the_jobs_virtual_environment(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    path = wheel(tree, VENV_SITE, "2.21.5")
    found = library(tmp_path, {"VIRTUAL_ENV": "/opt/venv"})
    assert (found.path, found.version) == (path, "2.21.5")
    assert found.source == "the NCCL wheel of the Python at /opt/venv (VIRTUAL_ENV)"
    assert found.version_from == f"the wheel's metadata {VENV_SITE}/nvidia_nccl_cu12-2.21.5.dist-info"


def test_ld_library_path_comes_before_the_wheel_which_it_shadows(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    wheel_path = wheel(tree, VENV_SITE, "2.21.5")
    path = built_library(tree, "/opt/nccl/lib", "2.19.3")
    found = library(tmp_path, {"VIRTUAL_ENV": "/opt/venv", "LD_LIBRARY_PATH": "/usr/local/lib:/opt/nccl/lib"})
    assert (found.path, found.version, found.source) == (path, "2.19.3", "LD_LIBRARY_PATH (/opt/nccl/lib)")
    assert found.version_from == "the file name libnccl.so.2.19.3"
    assert found.shadowed == (f"{wheel_path} (the NCCL wheel of the Python at /opt/venv (VIRTUAL_ENV))",)


@pytest.mark.parametrize("old_table", [False, True])
def test_the_loader_cache_names_debians_libnccl2(tmp_path, old_table):
    tree = machines.SysfsTree(tmp_path)
    path = built_library(tree, "/usr/lib/x86_64-linux-gnu", "2.18.5")
    tree.write("/etc/ld.so.cache", ld_so_cache([("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
                                                ("libnccl.so.2", path)], old_table))
    found = library(tmp_path)
    assert (found.path, found.version) == (path, "2.18.5")
    assert found.source == "/etc/ld.so.cache (Debian/Ubuntu's libnccl2 installs it there)"


def test_without_a_cache_the_default_directories_hold_rhels_libnccl(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    path = built_library(tree, "/usr/lib64", "2.23.4")
    found = library(tmp_path)
    assert (found.path, found.version) == (path, "2.23.4")
    assert found.source == "the loader's default directories (RHEL's libnccl installs it there)"


def test_a_cache_that_does_not_list_it_still_leaves_the_default_directories(tmp_path):
    """glibc (elf/dl-load.c _dl_map_object) tries its default directories whenever the cache
    gave nothing: a libnccl installed without running ldconfig still loads."""
    tree = machines.SysfsTree(tmp_path)
    path = built_library(tree, "/usr/lib64", "2.23.4")
    tree.write("/etc/ld.so.cache", ld_so_cache([("libc.so.6", "/lib64/libc.so.6")]))
    found = library(tmp_path)
    assert (found.path, found.version) == (path, "2.23.4")
    assert found.source == "the loader's default directories (RHEL's libnccl installs it there)"


def test_nccl_names_the_library_whose_version_is_in_its_bytes(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    tree.write("/scratch/libnccl.so.2", library_bytes("2.27.3+cuda12.9"))
    found = library(tmp_path, nccl="/scratch/libnccl.so.2")
    assert (found.path, found.version, found.source) == ("/scratch/libnccl.so.2", "2.27.3", "--nccl")
    assert found.version_from == 'the library\'s bytes ("NCCL version 2.27.3+cuda12.9")'


def test_nccl_names_the_jobs_python_interpreter(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    tree.write("/opt/conda/envs/train/bin/python3.12", "")
    path = wheel(tree, "/opt/conda/envs/train/lib/python3.12/site-packages", "2.26.2", cuda=13)
    found = library(tmp_path, {"VIRTUAL_ENV": "/opt/venv"}, nccl="/opt/conda/envs/train/bin/python3.12")
    assert (found.path, found.version) == (path, "2.26.2")
    assert found.source == "the NCCL wheel of the Python at /opt/conda/envs/train/bin/python3.12 (--nccl)"


def test_this_interpreters_wheel_counts_last(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    path = wheel(tree, "/usr/lib/python3/dist-packages", "2.20.5")
    found = library(tmp_path, this_python=["/usr/lib/python3/dist-packages"])
    assert (found.path, found.source) == (path, "the NCCL wheel of this Python (gdrprobe's own interpreter)")


def test_the_version_string_is_found_across_a_chunk_boundary(tmp_path, monkeypatch):
    tree = machines.SysfsTree(tmp_path)
    tree.write("/lib/libnccl.so.2", library_bytes("2.30.7+cuda13.0"))
    monkeypatch.setattr(nccl_library, "SCAN_CHUNK", 4100)       # the mark straddles two reads
    assert nccl_library.version_in_bytes(SysRoot(str(tmp_path)), "/lib/libnccl.so.2") == "2.30.7+cuda13.0"


def test_nothing_found_is_a_skip_that_names_the_flag(tmp_path):
    nccl_machines.pix_and_pxb(tmp_path)
    finding = findings(run_doctor(str(tmp_path), environ={}))["nccl.library"]
    assert finding.status is Status.SKIP and "NCCL 2.31.0" in finding.summary and "--nccl PATH" in finding.fix


# ---- the rules of the release ------------------------------------------------------------------


def test_nccl_before_2_23_4_misses_peermem_on_kernel_6_8(tmp_path):
    """A driver update took away /sys/kernel/mm/memory_peers; an NCCL older than 2.23.4 looks
    only there, so GPUDirect RDMA is off while the verbs path itself works."""
    tree = nccl_machines.peermem_kernel_6_8(tmp_path)
    built_library(tree, "/opt/nccl/lib", "2.22.3")
    report = run_doctor(str(tmp_path), environ={"LD_LIBRARY_PATH": "/opt/nccl/lib"})
    found = findings(report)
    assert found["nccl.library"].status is Status.INFO and "NCCL 2.22.3" in found["nccl.library"].summary
    assert not any(d.gdr_write for d in report.nccl)
    assert found["stack.path"].status is Status.FAIL
    assert "upgrade the job's NCCL to 2.23.4 or newer" in found["stack.path"].fix
    assert found["stack.peermem"].status is Status.WARN and "NCCL 2.22.3" in found["stack.peermem"].summary
    assert report.nccl_library.version == "2.22.3"


def test_nccl_2_23_4_counts_the_module_file(tmp_path):
    tree = nccl_machines.peermem_kernel_6_8(tmp_path)
    built_library(tree, "/opt/nccl/lib", "2.23.4")
    report = run_doctor(str(tmp_path), environ={"LD_LIBRARY_PATH": "/opt/nccl/lib"})
    assert all(d.gdr_write for d in report.nccl) and findings(report)["stack.path"].status is Status.OK


@pytest.mark.parametrize("version, gdr", [("2.25.1", False), ("2.26.2", False), ("2.27.3", True), ("2.30.7", True)])
def test_grace_nic_gdr_follows_the_release(tmp_path, version, gdr):
    """No C2C GDR before 2.26.2; NCCL_NET_GDR_C2C defaults to 0 in 2.26, 1 from 2.27.3."""
    tree = nccl_machines.gh200(tmp_path)
    built_library(tree, "/usr/lib64", version)
    (decision,) = run_doctor(str(tmp_path), environ={}).nccl
    assert decision.gdr_write is gdr


def test_nccl_before_dmabuf_has_no_path_on_a_dmabuf_only_node(tmp_path):
    tree = nccl_machines.dmabuf_only(tmp_path)
    built_library(tree, "/usr/lib64", "2.12.12")
    report = run_doctor(str(tmp_path), environ={})
    assert not any(d.gdr_write for d in report.nccl)
    assert "NCCL 2.12.12 predates DMA-BUF registration" in findings(report)["stack.path"].summary


# ---- reachable from the CLI, and kept by capture for the replay ---------------------------------


def test_doctor_nccl_flag_json_and_capture_replay(tmp_path, capsys):
    tree = nccl_machines.pix_and_pxb(tmp_path / "node")
    tree.write("/scratch/libnccl.so.2", library_bytes("2.21.5+cuda12.4"))
    assert main(["doctor", "--root", str(tmp_path / "node"), "--nccl", "/scratch/libnccl.so.2", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["nccl_library"]["version"] == "2.21.5"
    assert document["nccl_library"]["source"] == "--nccl"
    main(["doctor", "--root", str(tmp_path / "node"), "--nccl", "/scratch/libnccl.so.2"])
    assert "NCCL: 2.21.5, /scratch/libnccl.so.2 (--nccl)" in capsys.readouterr().out.splitlines()
    capture(str(tmp_path / "copy"), root=str(tmp_path / "node"), environ={}, nccl="/scratch/libnccl.so.2")
    # The capture keeps the first MiB of a library, not the version string deep inside it:
    # the version read from its bytes is captured as a fact.
    (tmp_path / "copy/scratch/libnccl.so.2").write_bytes(b"\x7fELF")
    replay = run_doctor(str(tmp_path / "copy"))
    assert (replay.nccl_library.path, replay.nccl_library.version) == ("/scratch/libnccl.so.2", "2.21.5")


# 2.31's changes (an NVLink's far end by type, the inter-CPU table, no data-direct forceFlush),
# which every release before it differs by.
UNTIL_2_31 = ("NVLink's far end by its bus id alone", "every AMD CPU's inter-socket link")


@pytest.mark.parametrize("version, expected", [
    ((2, 31, 2), ()),
    ((2, 30, 7), UNTIL_2_31 + ("a data-direct NIC's receives are always flushed",)),
    ((2, 28, 9), ("PXN relays through an NVLink peer even where that peer has no GPUDirect RDMA",
                  "NCCL_NET_GDR_LEVEL defaults to PXB (changed in 2.29.2)", "P2C to every NIC of a C2C GPU's CPU",
                  "MLO partitions use GPUDirect RDMA like whole GPUs") + UNTIL_2_31
     + ("a data-direct NIC's receives are always flushed",)),
    ((2, 8, 4), ("no DMA-BUF", "peer memory counts only", "no PXN", "no GPUDirect RDMA to NICs behind",
                 "NCCL_NET_GDR_LEVEL defaults to PXB", "NCCL_NET_GDR_READ's default keeps sends off",
                 "MLO partitions", "no PCIe relaxed ordering", "NCCL_NET is matched case-sensitively",
                 "no NIC fusion", "no Broadcom switch", "no mlx5 data-direct devices", "channels spread")
     + UNTIL_2_31)])
def test_differences_from_the_modelled_release_name_each_rule_once(version, expected):
    found = NcclRules(version).differences()
    assert len(found) == len(expected) and all(f.startswith(e) for f, e in zip(found, expected))
