"""The job's librccl on an AMD node, found as the job's libnccl is (gdrprobe/doctor/facts/
nccl_library.py's RCCL): PyTorch's ROCm wheels' bundled torch/lib/librccl.so (NEEDED renamed
from librccl.so.1, DT_RPATH $ORIGIN: pytorch .ci/manywheel/build_common.sh), ROCm's
/opt/rocm/lib/librccl.so.1 (ROCm/rccl 0cbce2a7 CMakeLists.txt rocm_set_soversion "1.0"), its
version read from the "RCCL version : x.y.z" in its bytes (src/init.cc VERSION_STRING), and the
decisions then following RCCL on that version's NCCL topology. Before: "the job's librccl is
not looked for"."""

from __future__ import annotations

import json

from gdrprobe.cli import main
from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines, rocm_machines
from tests.unit.doctor.nccl_libraries import elf_object, ld_so_cache, torch

VENV_SITE = "/opt/venv/lib/python3.12/site-packages"
ROCM_LIB = rocm_machines.ROCM_LIB
rccl_bytes, rocm_install = rocm_machines.rccl_bytes, rocm_machines.rocm_install


def rocm_torch(tree: machines.SysfsTree, version: str = "2.21.5") -> str:
    """A PyTorch ROCm wheel: libtorch_hip.so asks for librccl.so, found by its $ORIGIN RPATH."""
    torch(tree, VENV_SITE, library="libtorch_hip.so", needed=("libamdhip64.so", "librccl.so"), rpath="$ORIGIN")
    tree.write(f"{VENV_SITE}/torch/lib/librccl.so", rccl_bytes(version))
    return f"{VENV_SITE}/torch/lib/librccl.so"


def library_of(tmp_path, environ=None, nccl=None):
    (tmp_path / "gdrprobe-capture").mkdir(exist_ok=True)
    (tmp_path / "gdrprobe-capture/nccl.json").write_text(json.dumps({"site_packages": []}))
    return DoctorContext(SysRoot(str(tmp_path)), environ or {}, nccl)


def test_a_rocm_torch_wheel_loads_its_bundled_librccl_before_rocms(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=None)
    rocm_install(tree, version="2.20.5")
    bundled = rocm_torch(tree)
    ctx = library_of(tmp_path, nccl=VENV_SITE)
    library = ctx.nccl_library
    assert (library.library, library.path, library.version) == ("RCCL", bundled, "2.21.5")
    assert library.source == f"DT_RPATH of {VENV_SITE}/torch/lib/libtorch_hip.so ($ORIGIN)"
    assert library.version_from == "the library's bytes (\"RCCL version : 2.21.5\")"
    assert ctx.nccl_rules.library == "RCCL" and ctx.nccl_rules.effective == (2, 21, 5)


def test_a_program_without_python_loads_rocms_librccl_and_its_version_sets_the_topology(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=None)
    soname = rocm_install(tree, version="2.22.3")
    ctx = library_of(tmp_path)
    assert (ctx.nccl_library.path, ctx.nccl_library.version) == (soname, "2.22.3")
    assert ctx.nccl_library.source.startswith("ROCm's lib (/opt/rocm/lib")
    assert ctx.nccl_rules.effective == (2, 22, 3)
    found = {f.id: f for f in run_doctor(str(tmp_path), environ={}).findings}["nccl.library"]
    assert found.status is Status.INFO
    assert found.summary.startswith(f"the job will load RCCL 2.22.3 from {soname}")
    assert "on NCCL 2.22.3's topology" in found.summary


def test_the_loaders_cache_names_rocms_package(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=None)
    soname = rocm_install(tree)
    tree.write("/etc/ld.so.cache", ld_so_cache([("librccl.so.1", soname)]))
    library = library_of(tmp_path).nccl_library
    assert library.source == "/etc/ld.so.cache (ROCm's rccl package installs it there)"


def test_rocm_path_names_rocms_lib_and_nccl_names_a_directory_holding_librccl(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=None)
    versioned = rocm_install(tree, "/opt/rocm-6.3.0/lib")
    assert library_of(tmp_path, {"ROCM_PATH": "/opt/rocm-6.3.0"}).nccl_library.path == versioned
    named = library_of(tmp_path, nccl="/opt/rocm-6.3.0/lib").nccl_library
    assert (named.path, named.source, named.version) == (versioned, "--nccl", "2.21.5")


def test_no_librccl_is_said_with_rccls_modelled_rules(tmp_path):
    rocm_machines.mi300x_node(tmp_path, rocm=None)
    found = {f.id: f for f in run_doctor(str(tmp_path), environ={}).findings}["nccl.library"]
    assert found.status is Status.SKIP
    assert found.summary.startswith("no librccl found")
    assert found.fix == "Name the job's librccl or its Python with --nccl PATH."


def test_an_nvidia_node_still_looks_for_libnccl_not_librccl(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    rocm_install(tree)
    tree.write("/usr/lib/x86_64-linux-gnu/x.so", elf_object())
    library = library_of(tmp_path).nccl_library
    assert (library.library, library.path) == ("NCCL", None)


def test_doctor_json_text_and_capture_replay_name_rccl(tmp_path, capsys):
    tree = rocm_machines.mi300x_node(tmp_path / "node", rocm=None)
    soname = rocm_install(tree)
    assert main(["doctor", "--root", str(tmp_path / "node"), "--json"]) in (0, 1)
    document = json.loads(capsys.readouterr().out)
    assert (document["nccl_library"]["library"], document["nccl_library"]["version"]) == ("RCCL", "2.21.5")
    main(["doctor", "--root", str(tmp_path / "node")])
    assert f"RCCL: 2.21.5, {soname} (" in capsys.readouterr().out
    capture(str(tmp_path / "copy"), root=str(tmp_path / "node"), environ={})
    (tmp_path / "copy/opt/rocm/lib/librccl.so.1.0.60300").write_bytes(b"\x7fELF")   # the version is a fact
    replay = run_doctor(str(tmp_path / "copy"))
    assert (replay.nccl_library.library, replay.nccl_library.version) == ("RCCL", "2.21.5")
