"""The libnccl a job loads, found as glibc's loader finds it for the job's torch
(gdrprobe/doctor/facts/nccl_library.py, dynamic_loader.py, elf_dynamic.py, torch_preload.py,
pythons.py). Was: any NCCL wheel of the Python came before the cache, a file two wheels
claim took the first one's version, and without --nccl only the system's copy was looked at."""

from __future__ import annotations

import json
import os

import pytest

from gdrprobe.cli import main
from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts import pythons
from gdrprobe.doctor.facts.elf_dynamic import ElfUnreadable, read_dynamic
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines, nccl_machines
from tests.unit.doctor.nccl_libraries import built_library, elf_object, ld_so_cache, library_bytes, torch, wheel

IMAGE_SITE = "/usr/local/lib/python3.12/dist-packages"     # where an NGC image's pip puts torch
IMAGE_LIB = "/usr/lib/x86_64-linux-gnu"
VENV_SITE = "/opt/venv/lib/python3.11/site-packages"
OBJECT = elf_object(needed=("libnccl.so.2",))
PIP_RPATH = "$ORIGIN/../../nvidia/cublas/lib:$ORIGIN/../../nvidia/nccl/lib:$ORIGIN"   # PyTorch's pip wheels

# torch/__init__.py's shapes the reader keys on (written here, in the structure of PyTorch's
# releases): preloading only after libtorch_global_deps.so failed for a CUDA library ...
PRELOAD_ON_FAILURE = '''
def _preload_cuda_deps(lib_folder, lib_name):
    pass

def _load_global_deps():
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        cuda_libs = {"cublas": "libcublas.so.*[0-9]", "cuda_runtime": "libcudart.so.*[0-9]",
                     "nccl": "libnccl.so.*[0-9]"}
        if not [lib for lib in cuda_libs.values() if lib.split(".")[0] in err.args[0]]:
            raise err
        for lib_folder, lib_name in cuda_libs.items():
            _preload_cuda_deps(lib_folder, lib_name)
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
'''
# ... and also after a success, when libcudart is mapped: the whole list, a missing library
# ending it (REQUIRED), or each one best-effort.
PRELOAD_ON_SUCCESS = '''
def _get_cuda_dep_paths(path, lib_folder, lib_name):
    return []

def _preload_cuda_deps(err=None, required=True):
    cuda_libs = [("cublas", "libcublasLt.so.*[0-9]"), ("cuda_runtime", "libcudart.so.*[0-9]"),
                 ("nccl", "libnccl.so.*[0-9]")]

def _load_global_deps():
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        try:
            if "libcudart.so" not in open("/proc/self/maps").read():
                return
            _preload_cuda_deps(REQUIRED)
        except Exception:
            pass
    except OSError as err:
        _preload_cuda_deps(err)
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
'''


def found(tmp_path, environ=None, nccl=None, this_python=()):
    (tmp_path / "gdrprobe-capture").mkdir(exist_ok=True)
    (tmp_path / "gdrprobe-capture/nccl.json").write_text(json.dumps({"site_packages": list(this_python)}))
    return DoctorContext(SysRoot(str(tmp_path)), environ or {}, nccl).nccl_library


def nccl_finding(root, **kwargs):
    return {f.id: f for f in run_doctor(str(root), **kwargs).findings}["nccl.library"]


def ngc_image(tmp_path, wheel_version="2.27.3", **torch_dynamic) -> machines.SysfsTree:
    """An NGC-style image: its libnccl2 2.21.5 in the cache, torch built against it (RUNPATH
    with no wheel directory), and an nvidia-nccl-cu12 wheel some other package pulled in."""
    tree = machines.SysfsTree(tmp_path)
    image = built_library(tree, IMAGE_LIB, "2.21.5")
    tree.write("/etc/ld.so.cache", ld_so_cache([("libnccl.so.2", image)]))
    torch_dynamic.setdefault("runpath", "$ORIGIN:/usr/local/cuda/lib64")
    torch(tree, IMAGE_SITE, **torch_dynamic)
    if wheel_version:
        wheel(tree, IMAGE_SITE, wheel_version)
    return tree


# ---- the ELF reader -----------------------------------------------------------------------


def test_the_dynamic_section_is_read_from_the_objects_bytes(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    tree.write("/lib/x.so", elf_object(needed=("libnccl.so.2", "libc.so.6"), soname="libx.so.1",
                                       rpath="$ORIGIN/a", runpath="$ORIGIN/b:/c", nodeflib=True, padding=5000))
    dynamic = read_dynamic(SysRoot(str(tmp_path)), "/lib/x.so")
    assert (dynamic.needed, dynamic.soname, dynamic.rpath, dynamic.runpath, dynamic.nodeflib) == \
        (("libnccl.so.2", "libc.so.6"), "libx.so.1", "$ORIGIN/a", "$ORIGIN/b:/c", True)


@pytest.mark.parametrize("data, reason", [
    (elf_object(needed=("libnccl.so.2",), ident=b"\x7fELF\x01\x01\x01"), "not a 64-bit little-endian"),
    (elf_object(needed=("libnccl.so.2",), ident=b"\x7fELF\x02\x02\x01"), "not a 64-bit little-endian"),
    (OBJECT[:200], "cut short"),
    (library_bytes("2.21.5"), r"not a 64-bit little-endian ELF object \(class 0, data 0\)"),
    (OBJECT[:0x38] + b"\xff\xff" + OBJECT[0x3a:], "more than this reader reads"),       # e_phnum PN_XNUM
    (b"#!/bin/sh\n", "not an ELF object")])
def test_other_objects_are_refused_with_the_reason(tmp_path, data, reason):
    machines.SysfsTree(tmp_path).write("/lib/x.so", data)
    with pytest.raises(ElfUnreadable, match=reason):
        read_dynamic(SysRoot(str(tmp_path)), "/lib/x.so")


# ---- the loader's order for the job's torch -------------------------------------------------


def test_an_images_torch_loads_the_images_libnccl_not_the_wheel_beside_it(tmp_path):
    """glibc tries a RUNPATH, then its cache: the wheel is on neither path."""
    ngc_image(tmp_path)
    library = found(tmp_path, nccl="/usr/bin/python3")
    assert (library.path, library.version) == (f"{IMAGE_LIB}/libnccl.so.2", "2.21.5")
    assert library.source == "/etc/ld.so.cache (Debian/Ubuntu's libnccl2 installs it there)"
    assert library.python == "the Python at /usr/bin/python3 (--nccl)"
    assert f"{IMAGE_SITE}/nvidia/nccl/lib/libnccl.so.2" not in " ".join(library.shadowed)


@pytest.mark.parametrize("tag, expected", [
    ("rpath", (f"{VENV_SITE}/nvidia/nccl/lib/libnccl.so.2",
               f"DT_RPATH of {VENV_SITE}/torch/lib/libtorch_cuda.so ($ORIGIN/../../nvidia/nccl/lib)")),
    ("runpath", ("/opt/nccl/lib/libnccl.so.2", "LD_LIBRARY_PATH (/opt/nccl/lib)"))])
def test_a_dt_rpath_comes_before_ld_library_path_a_dt_runpath_after(tmp_path, tag, expected):
    """PyTorch's pip wheels carry DT_RPATH (patchelf --force-rpath): LD_LIBRARY_PATH does not
    override their wheel; a DT_RUNPATH comes after it."""
    tree = machines.SysfsTree(tmp_path)
    wheel(tree, VENV_SITE, "2.27.3")
    built_library(tree, "/opt/nccl/lib", "2.19.3")
    torch(tree, VENV_SITE, **{tag: PIP_RPATH})
    library = found(tmp_path, {"LD_LIBRARY_PATH": "/opt/nccl/lib"}, nccl="/opt/venv")
    assert (library.path, library.source) == expected
    assert len(library.shadowed) == 1


def test_a_runpath_hides_the_rpath_of_the_same_object(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    wheel(tree, VENV_SITE, "2.27.3")
    built_library(tree, "/opt/nccl/lib", "2.19.3")
    torch(tree, VENV_SITE, rpath=PIP_RPATH, runpath="/opt/nccl/lib")
    library = found(tmp_path, nccl=VENV_SITE)
    assert library.source == f"DT_RUNPATH of {VENV_SITE}/torch/lib/libtorch_cuda.so (/opt/nccl/lib)"
    assert library.shadowed == ()


def test_the_executables_rpath_counts_with_its_real_directory_as_origin(tmp_path):
    """A venv made from conda's Python: bin/python3 links to /opt/conda/bin/python3.11, whose
    DT_RPATH $ORIGIN/../lib is /opt/conda/lib (glibc takes the executable's origin from
    /proc/self/exe); torch's own DT_RPATH names no libnccl."""
    tree = machines.SysfsTree(tmp_path)
    tree.write("/opt/conda/bin/python3.11", elf_object(needed=("libc.so.6",), rpath="$ORIGIN/../lib"))
    os.makedirs(tree.path("/opt/venv/bin"))
    os.symlink("/opt/conda/bin/python3.11", tree.path("/opt/venv/bin/python3"))
    conda = built_library(tree, "/opt/conda/lib", "2.26.2")
    torch(tree, VENV_SITE, rpath="$ORIGIN")
    library = found(tmp_path, nccl="/opt/venv/bin/python3")
    assert (library.path, library.version) == (conda, "2.26.2")
    assert library.source == "DT_RPATH of /opt/venv/bin/python3 ($ORIGIN/../lib)"


def test_nodeflib_keeps_the_cache_and_default_directories_out(tmp_path):
    ngc_image(tmp_path, wheel_version=None, nodeflib=True)
    library = found(tmp_path, nccl="/usr/bin/python3")
    assert library.path is None


def test_a_torch_that_links_nccl_in_asks_the_loader_for_none(tmp_path):
    """PyTorch's USE_STATIC_NCCL builds: no library of torch needs libnccl.so.2."""
    tree = ngc_image(tmp_path, needed=("libc10_cuda.so",), payload=b"NCCL version 2.10.3+cuda11.3\0")
    library = found(tmp_path, nccl="/usr/bin/python3")
    assert (library.path, library.version) == (f"{IMAGE_SITE}/torch/lib/libtorch_cuda.so", "2.10.3")
    assert library.source.startswith(f"linked into {IMAGE_SITE}/torch/lib/libtorch_cuda.so")
    assert tree.path(f"{IMAGE_LIB}/libnccl.so.2").exists()


# ---- torch's own preloading ---------------------------------------------------------------


def test_torch_preloads_the_first_sys_path_wheel_when_its_global_deps_fail(tmp_path):
    """torch in /usr/local's dist-packages, the nvidia wheels in /usr/lib/python3/dist-packages:
    its RPATH misses them, libtorch_global_deps.so fails for libcublas, torch preloads the
    list from sys.path, and libtorch_cuda.so's libnccl.so.2 is that one."""
    tree = ngc_image(tmp_path, wheel_version=None, rpath=PIP_RPATH, init=PRELOAD_ON_FAILURE,
                     global_deps=elf_object(needed=("libcublas.so.12", "libcudart.so.12"), rpath=PIP_RPATH))
    wheels = "/usr/lib/python3/dist-packages"
    for folder, name in (("cublas", "libcublas.so.12"), ("cuda_runtime", "libcudart.so.12")):
        tree.write(f"{wheels}/nvidia/{folder}/lib/{name}", b"\x7fELF")
    path = wheel(tree, wheels, "2.27.3")
    library = found(tmp_path, nccl="/usr/bin/python3")
    assert (library.path, library.version) == (path, "2.27.3")
    assert library.source == (f"preloaded by {IMAGE_SITE}/torch/__init__.py from sys.path "
                              "(libtorch_global_deps.so finds no libcublas.so.12)")


@pytest.mark.parametrize("required, preloaded", [("", False), ("required=False", True)])
def test_torch_preloads_after_success_as_its_source_says(tmp_path, required, preloaded):
    """The image's libcudart loads; a torch that preloads its whole list stops at libcublasLt
    (no wheel), one that goes on best-effort opens the NCCL wheel before libtorch_cuda.so asks."""
    tree = ngc_image(tmp_path, init=PRELOAD_ON_SUCCESS.replace("REQUIRED", required),
                     global_deps=elf_object(needed=("libcudart.so.12",), runpath="/usr/local/cuda/lib64"))
    tree.write("/usr/local/cuda/lib64/libcudart.so.12", b"\x7fELF")
    library = found(tmp_path, nccl="/usr/bin/python3")
    wheel_path = f"{IMAGE_SITE}/nvidia/nccl/lib/libnccl.so.2"
    assert (library.path == wheel_path) is preloaded
    if preloaded:
        assert library.source == (f"preloaded by {IMAGE_SITE}/torch/__init__.py from sys.path "
                                  "(libtorch_global_deps.so loaded /usr/local/cuda/lib64/libcudart.so.12)")
        assert library.version == "2.27.3"


# ---- the version of a file two wheels claim -------------------------------------------------


@pytest.mark.parametrize("in_bytes, version", [(True, "2.27.7"), (False, None)])
def test_a_file_two_wheels_list_takes_its_version_from_its_bytes(tmp_path, in_bytes, version):
    """nvidia-nccl-cu12 and -cu13 unpack the same nvidia/nccl/lib/libnccl.so.2: the last one
    installed owns the bytes, whichever dist-info sorts first."""
    tree = machines.SysfsTree(tmp_path)
    wheel(tree, VENV_SITE, "2.21.5", cuda=12)
    path = wheel(tree, VENV_SITE, "2.27.7", cuda=13, in_bytes=in_bytes)
    library = found(tmp_path, nccl="/opt/venv")
    assert (library.path, library.version) == (path, version)
    both = (f"{VENV_SITE}/nvidia_nccl_cu12-2.21.5.dist-info and {VENV_SITE}/nvidia_nccl_cu13-2.27.7.dist-info "
            "both list it")
    assert library.version_from == (f'the library\'s bytes ("NCCL version 2.27.7+cuda13.4"); {both}' if in_bytes
                                    else f"its bytes name no version; {both}")


# ---- which Python? ----------------------------------------------------------------------------


def two_pythons(tmp_path) -> machines.SysfsTree:
    """The image's Python (its torch loads the image's 2.21.5) and a venv with PyTorch's pip
    wheel (DT_RPATH: the venv's NCCL wheel, 2.27.3)."""
    tree = nccl_machines.pix_and_pxb(tmp_path)
    ngc_image(tmp_path, wheel_version=None)
    tree.write("/opt/venv/pyvenv.cfg", "home = /usr/bin\n")
    tree.write("/opt/venv/bin/python3", "")            # the interpreter --nccl may name
    wheel(tree, VENV_SITE, "2.27.3")
    torch(tree, VENV_SITE, rpath=PIP_RPATH)
    tree.write("/home/alice/.venv/pyvenv.cfg", "")        # home directories are not crawled
    wheel(tree, "/home/alice/.venv/lib/python3.12/site-packages", "2.28.3")
    return tree


def test_without_nccl_every_python_found_is_listed_and_the_answer_is_a_caveat(tmp_path):
    two_pythons(tmp_path)
    finding = nccl_finding(tmp_path, environ={})
    assert finding.status is Status.WARN and finding.summary.startswith("which Python?")
    assert "with the Python at /usr (system) the job loads NCCL 2.21.5" in finding.summary
    assert "--nccl PATH" in finding.fix
    evidence = {e.source: e.value for e in finding.evidence}
    assert evidence["the job's Python"] == "not named (--nccl): the default is the Python at /usr (system)"
    assert evidence["NCCL of the Python at /opt/venv (virtual environment)"] == (
        f"{VENV_SITE}/nvidia/nccl/lib/libnccl.so.2 (NCCL 2.27.3; DT_RPATH of "
        f"{VENV_SITE}/torch/lib/libtorch_cuda.so ($ORIGIN/../../nvidia/nccl/lib))")
    assert evidence["NCCL of a program that is no Python (nccl-tests, a C++ job)"].startswith(
        f"{IMAGE_LIB}/libnccl.so.2 (NCCL 2.21.5; /etc/ld.so.cache")
    assert not any("alice" in e.value or "alice" in e.source for e in finding.evidence)


def test_naming_the_python_answers_without_a_caveat(tmp_path, capsys):
    two_pythons(tmp_path)
    assert main(["doctor", "--root", str(tmp_path), "--nccl", "/opt/venv/bin/python3", "--json"]) in (0, 1)
    document = json.loads(capsys.readouterr().out)["nccl_library"]
    assert (document["version"], document["python"], document["python_named"]) == (
        "2.27.3", "the Python at /opt/venv/bin/python3 (--nccl)", True)
    assert document["candidates"] == []
    finding = nccl_finding(tmp_path, environ={}, nccl="/opt/venv/bin/python3")
    assert finding.status is Status.INFO and "NCCL 2.27.3" in finding.summary


def test_the_json_lists_each_candidate(tmp_path, capsys):
    two_pythons(tmp_path)
    main(["doctor", "--root", str(tmp_path), "--json"])
    document = json.loads(capsys.readouterr().out)["nccl_library"]
    assert document["python_named"] is False
    assert [(c["python"], c["version"]) for c in document["candidates"]] == [
        ("the Python at /usr (system)", "2.21.5"), ("the Python at /opt/venv (virtual environment)", "2.27.3"),
        ("a program that is no Python (nccl-tests, a C++ job)", "2.21.5")]


def test_conda_environments_are_candidates_and_their_lib_counts(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    tree.write("/opt/conda/envs/train/conda-meta/history", "")
    tree.write("/opt/conda/envs/train/lib/python3.12/site-packages/numpy/__init__.py", "")
    path = built_library(tree, "/opt/conda/envs/train/lib", "2.26.2")
    library = found(tmp_path)
    assert (library.path, library.python) == (path, "the Python at /opt/conda/envs/train (conda)")
    assert library.source == "the conda environment's lib (the Python at /opt/conda/envs/train (conda))"


# ---- kept by a capture --------------------------------------------------------------------


def test_a_capture_keeps_the_dynamic_section_past_its_first_mib(tmp_path):
    ngc_image(tmp_path / "node", padding=(1 << 20) + 4096)
    nccl_machines.pix_and_pxb(tmp_path / "node")
    capture(str(tmp_path / "copy"), root=str(tmp_path / "node"), environ={}, nccl="/usr/bin/python3")
    kept = tmp_path / f"copy{IMAGE_SITE}/torch/lib/libtorch_cuda.so"
    assert kept.stat().st_size == 1 << 20
    replay = run_doctor(str(tmp_path / "copy")).nccl_library
    assert (replay.path, replay.version) == (f"{IMAGE_LIB}/libnccl.so.2", "2.21.5")
    assert replay.source == "/etc/ld.so.cache (Debian/Ubuntu's libnccl2 installs it there)"


def test_the_machines_pythons_are_bounded(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    for index in range(40):
        wheel(tree, f"/opt/env{index:02d}/lib/python3.12/site-packages", "2.21.5")
    library = found(tmp_path)
    assert len(library.candidates) == pythons.MAX_PYTHONS + 1          # and the program that is no Python
    assert library.candidates[0].python == "the Python at /opt/env00 (prefix)"
