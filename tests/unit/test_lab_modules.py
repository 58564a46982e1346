"""lab/modules.py's and lab/dmabuf_guest.py's pure logic: names, versions, cache keys (no
download, no build)."""

import os

import pytest

from lab import dmabuf_guest, modules
from lab.kernel import LabError

HEADERS_DEPENDS = ("linux-headers-6.1.0-57-common (= 6.1.192-3), linux-kbuild-6.1 "
                   "(>= 6.1.192-3), linux-compiler-gcc-12-x86")


def test_the_release_comes_from_the_image_name():
    image = "/c/kernel/linux-image-6.1.0-57-amd64/boot/vmlinuz-6.1.0-57-amd64"
    assert modules.kernel_release(image) == "6.1.0-57-amd64"


@pytest.mark.parametrize("image", ["/boot/bzImage", "/boot/vmlinuz-"])
def test_an_image_not_named_vmlinuz_release_is_refused_by_name(image):
    with pytest.raises(LabError, match="vmlinuz-<release>"):
        modules.kernel_release(image)


def test_the_headers_bring_their_common_half_and_kbuild_at_their_version():
    assert modules.header_dependencies(HEADERS_DEPENDS) == [
        ("linux-headers-6.1.0-57-common", "6.1.192-3"), ("linux-kbuild-6.1", "6.1.192-3")]


def test_a_dependency_without_a_version_is_left_to_the_build_machine():
    assert modules.header_dependencies("linux-compiler-gcc-12-x86, libc6") == []


@pytest.mark.parametrize("vermagic, loads", [
    ("6.1.0-57-amd64 SMP preempt mod_unload modversions \n", True),
    ("6.1.0-58-amd64 SMP preempt mod_unload modversions", False),
    ("", False),
])
def test_a_module_loads_only_into_the_release_its_vermagic_names(vermagic, loads):
    assert modules.vermagic_matches(vermagic, "6.1.0-57-amd64") is loads


def sources(folder, **files):
    for name, text in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)


def test_the_cache_key_follows_every_source_and_the_kernel_version(tmp_path):
    sources(tmp_path, **{"rxe/rxe_dmabuf.c": "a", "exporter/Kbuild": "b"})
    key = modules.input_digest("6.1.192-3", str(tmp_path))
    assert key == modules.input_digest("6.1.192-3", str(tmp_path))     # stable
    assert key != modules.input_digest("6.1.192-4", str(tmp_path))
    sources(tmp_path, **{"exporter/Kbuild": "c"})
    assert key != modules.input_digest("6.1.192-3", str(tmp_path))
    sources(tmp_path, **{"exporter/Kbuild": "b", "verbs/new.c": ""})    # a file added
    assert key != modules.input_digest("6.1.192-3", str(tmp_path))


def test_a_guest_finds_the_build_for_todays_sources_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setattr(modules, "CACHE", str(tmp_path))
    release = "6.1.0-57-amd64"
    assert modules.built_modules(release) is None                  # nothing fetched yet
    sources(tmp_path, **{f"modules/{release}/tree/ready": "6.1.192-3\n"})
    folder = tmp_path / "modules" / release / modules.input_digest("6.1.192-3")
    sources(folder, **{name: "" for name in modules.PRODUCTS[:-1]})
    assert modules.built_modules(release) is None                  # a product missing
    sources(folder, **{modules.PRODUCTS[-1]: ""})
    built = modules.built_modules(release)
    assert built.folder == str(folder)
    assert built.rxe == str(folder / "rdma_rxe.ko")


def test_a_new_build_removes_the_builds_of_older_inputs_and_keeps_the_tree(tmp_path):
    for name in ("tree/ready", "old/rdma_rxe.ko", "new/rdma_rxe.ko"):
        sources(tmp_path, **{name: ""})
    modules.remove_older_builds(modules.Built(str(tmp_path / "new")))
    assert sorted(os.listdir(tmp_path)) == ["new", "tree"]


@pytest.mark.parametrize("verdict, passes", [
    ({"classification": "engaged", "mechanism": "dmabuf", "exit_code": 0}, True),
    ({"classification": "engaged", "mechanism": "peermem", "exit_code": 0}, False),
    ({"classification": "degraded", "mechanism": "dmabuf", "exit_code": 1}, False),
    # issue 28: a loaded machine's "degraded, inconclusive (0.63..1.06)": warn, never a drain
    ({"classification": "degraded", "mechanism": "dmabuf", "exit_code": 12}, True),
    ({"classification": "engaged", "mechanism": "dmabuf", "exit_code": 12}, True),
    ({"classification": "not engaged", "mechanism": "dmabuf", "exit_code": 1}, False),
    ({"classification": "not testable", "mechanism": None, "exit_code": 9}, False),
    (None, False),
])
def test_the_demo_passes_on_a_dmabuf_answer_that_never_drains(verdict, passes):
    assert dmabuf_guest.answered_by_dmabuf({"verdict": verdict}) is passes


# ---- the ROCm half of the dma-buf demo (issue 33) -----------------------------------------


def test_the_rocm_demo_runs_over_the_hip_standin_with_rocm_named(monkeypatch, tmp_path):
    built = dmabuf_guest.Built(str(tmp_path))
    env = dmabuf_guest.dmabuf_environment(built, "rocm")
    standin = env["LD_LIBRARY_PATH"].split(":")[0]
    assert os.path.exists(os.path.join(standin, "libamdhip64.so"))
    assert os.path.exists(os.path.join(standin, "libhsa-runtime64.so"))
    assert (env["GDRPROBE_GPU_RUNTIME"], env["LD_PRELOAD"]) == ("rocm", built.verbs_library)
    assert "GDRPROBE_GPU_RUNTIME" not in dmabuf_guest.dmabuf_environment(built)


def test_the_rocm_demo_needs_hip_pythons_venv_and_says_what_makes_it(monkeypatch, tmp_path):
    monkeypatch.setattr(dmabuf_guest, "HIP_PYTHON", str(tmp_path / "none" / "python"))
    with pytest.raises(LabError, match="./dev demo-rocm makes it"):
        dmabuf_guest.runtime_python("rocm")
    assert dmabuf_guest.runtime_python("cuda") == dmabuf_guest.sys.executable


def test_the_guest_demo_takes_only_the_runtimes_it_knows(capsys):
    assert modules.main(["guest-demo", "cuda", "opencl"]) == 2
    assert "not opencl" in capsys.readouterr().err
