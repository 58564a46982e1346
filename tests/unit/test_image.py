"""lab/image.py's logic: the cache key, the pinned dependencies, the tools' arguments, and
(where `./dev image` has built it) the archive as skopeo, the push tool, reads it."""

import json
import os
import shutil
import subprocess

import pytest

from lab import image

SOURCES = {"gdrprobe/__init__.py": b"x = 1\n", "csrc/gdr_loop.c": b"int main;\n"}
PINS = ["cuda-bindings==12.9.10", "cuda-python==12.9.10"]


def test_the_cache_key_is_the_same_for_the_same_inputs_in_any_order():
    reordered = dict(reversed(list(SOURCES.items())))
    assert image.cache_key(SOURCES, PINS, b"recipe") == image.cache_key(reordered, PINS, b"recipe")
    assert len(image.cache_key(SOURCES, PINS, b"recipe")) == 16


@pytest.mark.parametrize("sources, pins, recipe", [
    ({**SOURCES, "gdrprobe/__init__.py": b"x = 2\n"}, PINS, b"recipe"),     # a file's content
    ({"gdrprobe/__init__.py": b"x = 1\n"}, PINS, b"recipe"),                # a file gone
    ({**SOURCES, "gdrprobe/new.py": b""}, PINS, b"recipe"),                 # a file added
    (SOURCES, ["cuda-bindings==12.9.11", "cuda-python==12.9.10"], b"recipe"),  # a dependency
    (SOURCES, PINS, b"recipe with another package"),                      # the recipe
])
def test_any_changed_input_changes_the_cache_key(sources, pins, recipe):
    assert image.cache_key(sources, pins, recipe) != image.cache_key(SOURCES, PINS, b"recipe")


def test_the_key_of_this_checkout_is_stable_between_two_readings():
    if shutil.which("git") is None or not os.path.isdir(os.path.join(image.REPO, ".git")):
        pytest.skip("needs git and a git checkout")
    assert image.current_key() == image.current_key()


def test_the_wheel_sources_are_the_checkouts_files_not_its_build_outputs():
    if shutil.which("git") is None or not os.path.isdir(os.path.join(image.REPO, ".git")):
        pytest.skip("needs git and a git checkout")
    files = image.wheel_source_files()
    assert {"pyproject.toml", "setup.py", "README.md", "gdrprobe/_native.pyx",
            "csrc/gdr_loop.c"} <= set(files)
    assert not [f for f in files if f.endswith((".so", ".pyc")) or f == "gdrprobe/_native.c"]
    assert not [f for f in files if not f.startswith(("gdrprobe/", "csrc/", "LICENSE"))
                and f not in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")]


def test_pinned_dependencies_follow_the_closure_without_extras_at_installed_versions():
    requires = {
        "gdrprobe": ["cuda-python<13,>=12.6.2.post1", 'pytest>=7; extra == "test"'],
        "cuda-python": ["cuda_bindings~=12.9.10", 'cuda-bindings[all]~=12.9.10; extra == "all"'],
        "cuda_bindings": ["cuda-pathfinder~=1.1", 'numpy; extra == "test"'],
        "cuda-pathfinder": None,                     # metadata with no requirements at all
    }
    installed = {"cuda-python": "12.9.10", "cuda_bindings": "12.9.10", "cuda-pathfinder": "1.9.1"}
    pins = image.pinned_dependencies("gdrprobe", requires.get, installed.__getitem__)
    assert pins == ["cuda-bindings==12.9.10", "cuda-pathfinder==1.9.1", "cuda-python==12.9.10"]


def test_mmdebstrap_gets_the_suite_variant_packages_and_target_last():
    argv = image.mmdebstrap_argv("/tmp/rootfs")
    target = argv.index("/tmp/rootfs")
    assert argv[0] == "mmdebstrap" and argv[target - 1] == image.SUITE
    # After the target, the sources: the suite, its updates and its security fixes.
    assert [line.split()[2] for line in argv[target + 1:]] == [
        image.SUITE, f"{image.SUITE}-updates", f"{image.SUITE}-security"]
    assert "--variant=apt" in argv
    include = next(a for a in argv if a.startswith("--include="))
    assert set(include.split("=", 1)[1].split(",")) == set(image.PACKAGES)
    assert f"--hook-dir={image.MERGED_USR_HOOKS}" in argv
    # dpkg: the last matching option wins, so the copyright files must come after the docs.
    options = [a for a in argv if a.startswith("--dpkgopt=")]
    assert options.index("--dpkgopt=path-include=/usr/share/doc/*/copyright") > \
        options.index("--dpkgopt=path-exclude=/usr/share/doc/*")


def test_the_merged_usr_hook_exists_where_mmdebstrap_is_installed():
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is not installed (./dev setup installs it)")
    assert os.path.isfile(os.path.join(image.MERGED_USR_HOOKS, "setup00.sh"))


def test_the_image_configuration_sets_entrypoint_command_path_and_labels():
    argv = image.umoci_config_argv("/l:0.1.0", "0.1.0")
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert argv[:2] == ["umoci", "config"] and pairs["--image"] == "/l:0.1.0"
    assert pairs["--config.entrypoint"] == "/usr/local/bin/gdrprobe"
    assert pairs["--config.cmd"] == "check"
    assert pairs["--config.env"].startswith("PATH=/usr/local/sbin:/usr/local/bin:")
    labels = [argv[i + 1] for i, a in enumerate(argv) if a == "--config.label"]
    assert "org.opencontainers.image.version=0.1.0" in labels
    assert "org.opencontainers.image.title=gdrprobe" in labels


def test_missing_tools_name_their_debian_packages():
    def which(tool):
        return None if tool == "umoci" else f"/usr/bin/{tool}"
    assert image.missing_tools(which, lambda: False) == ["umoci", "python3-installer"]
    assert image.missing_tools(lambda tool: f"/usr/bin/{tool}", lambda: True) == []


def test_a_missing_tool_stops_the_build_with_the_fix(monkeypatch):
    monkeypatch.setattr(image, "missing_tools", lambda: ["mmdebstrap", "umoci"])
    with pytest.raises(image.ImageError, match=r"needs mmdebstrap, umoci.*'\./dev setup'"):
        image.require_tools()


def test_an_image_python_other_than_the_venvs_is_refused(tmp_path, monkeypatch):
    (tmp_path / "usr/lib/python3.99").mkdir(parents=True)
    with pytest.raises(image.ImageError, match="python3.99 but this venv runs python3"):
        image.check_same_python(str(tmp_path))
    monkeypatch.setattr(image.sys, "version_info", (3, 99, 0))
    image.check_same_python(str(tmp_path))


def test_the_built_archive_is_an_oci_archive_skopeo_reads():
    archive = os.path.join(image.LATEST, image.archive_name(image.version()))
    if not os.path.isfile(archive):
        pytest.skip("the image is not built: run ./dev image")
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (./dev setup installs it)")
    done = subprocess.run(["skopeo", "inspect", "--config", f"oci-archive:{archive}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    assert config["os"] == "linux" and config["architecture"] == "amd64"
    assert config["config"]["Entrypoint"] == [image.ENTRYPOINT]
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == image.version()
    assert len(config["rootfs"]["diff_ids"]) == 1


def test_a_failed_mmdebstrap_names_the_mirrors_it_needs(monkeypatch):
    def step(argv, what, timeout):
        raise image.ImageError(f"{what}: 'mmdebstrap' exited 25:\nE: Failed to fetch ...")
    monkeypatch.setattr(image, "step", step)
    with pytest.raises(image.ImageError) as caught:
        image.make_rootfs("/tmp/rootfs")
    assert "Failed to fetch" in str(caught.value)
    assert str(caught.value).endswith("from http://deb.debian.org/debian, "
                                      "http://deb.debian.org/debian-security: are they "
                                      "reachable from here?")
