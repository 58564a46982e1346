"""`./dev image`: gdrprobe in an OCI image built from Debian's packages, with no registry.

The root filesystem is Debian 12 made by mmdebstrap from Debian's mirror; gdrprobe goes in as
the wheel `./dev package` builds from its sdist (lab/package.py), with its one Python
dependency (cuda-python) at the versions this checkout's venv runs its tests with, from PyPI. umoci makes the OCI image
layout and sets its configuration; the layout is written as an oci-archive: a tar of the
layout directory, which is what skopeo's `oci-archive:` transport reads (containers-
transports(5); the layout itself: the OCI image spec's image-layout.md).

The result is cached in .lab-cache/image/KEY/, KEY a hash of every input (current_key), so a second
build of the same checkout is a look-up. KEY/bundle/rootfs is the image unpacked again by
`umoci unpack` from the layout that went into the archive: the lab runs gdrprobe there
(tests/lab/loopback/test_image_lab.py). docs/image.md.

    python -m lab.image          build (or find) the image; print the archive's path
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time

from packaging.requirements import Requirement

from lab import package
from lab.kernel import CACHE, REPO
from lab.package import (BuildError, cache_key, point_latest_at, run_step, version,
                         wheel_source_files)

SUITE = "bookworm"
# The suite with its point-release updates and security fixes, as Debian's own images and a
# default bookworm install list them (one-line sources.list entries: mmdebstrap(1), MIRROR).
SOURCES = (f"deb http://deb.debian.org/debian {SUITE} main",
           f"deb http://deb.debian.org/debian {SUITE}-updates main",
           f"deb http://deb.debian.org/debian-security {SUITE}-security main")
# mmdebstrap(1), VARIANTS: "apt" is the Essential:yes packages plus apt, the smallest set an
# image built FROM this one can still extend with apt-get ("minbase" adds Priority:required).
VARIANT = "apt"
# What gdrprobe needs at run time. python3-pyverbs depends on rdma-core (and so udev) itself;
# libibverbs1 and ibverbs-providers are named because the verbs path loads them directly;
# python3-prometheus-client (0.16 in bookworm, gdrprobe[prometheus]'s floor) because the
# node-problem-detector monitor in deploy/npd/ writes the check's metrics (--prometheus).
PACKAGES = ("python3", "python3-pyverbs", "libibverbs1", "ibverbs-providers", "rdma-core",
            "python3-prometheus-client")
# Documentation is no use in a container; the copyright files (the licences) stay. dpkg(1),
# --path-exclude and --path-include: the last matching option wins.
DPKG_OPTIONS = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
                "path-exclude=/usr/share/locale/*")
# Merged /usr made by mmdebstrap's own hook instead of the usrmerge package, which would pull
# perl (50 MB) into the image (mmdebstrap(1), --hook-dir; /usr/share/mmdebstrap/hooks/).
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"
# The files the gdrprobe wheel is built from (pyproject.toml's metadata names the README).
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE*", "gdrprobe",
                 "csrc")
# Where the wheels go: Debian's python3 installs into its default scheme, "posix_local"
# (Debian's sysconfig patch), as pip would in the image: /usr/local/lib/python3.X/dist-packages
# and /usr/local/bin. The installer is Debian's python3 itself, whose scheme is the image's.
PREFIX = "/usr/local"
ENTRYPOINT = f"{PREFIX}/bin/gdrprobe"
DEFAULT_COMMAND = "check"                   # `docker run IMAGE` runs the gate
ENV_PATH = f"{PREFIX}/sbin:{PREFIX}/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_DIR = os.path.join(CACHE, "image")
LATEST = os.path.join(IMAGE_DIR, "latest")  # a link to the newest KEY directory
# Bounds a mirror that stops answering, not a slow one: mmdebstrap took 42 to 79 s here.
MMDEBSTRAP_TIMEOUT_S = 1800
STEP_TIMEOUT_S = 600
# The tools the build runs beyond Debian's Essential set (tar, chroot), each with its package.
TOOLS = {"mmdebstrap": "mmdebstrap", "umoci": "umoci"}
INSTALLER = ("/usr/bin/python3", "python3-installer")


class ImageError(BuildError):
    """The image could not be built; the message names the cause and the fix."""


def step(argv: list[str], what: str, timeout: float = STEP_TIMEOUT_S, **kwargs) -> str:
    """One build step, bounded; its failure raises ImageError with the tail of its output."""
    return run_step(argv, what, timeout, ImageError, **kwargs)


def archive_name(tag: str) -> str:
    return f"gdrprobe-{tag}-oci.tar"


def missing_tools(which=shutil.which, installer_found=None) -> list[str]:
    """The Debian packages to install before the build can run, none when all are there."""
    missing = [package for tool, package in TOOLS.items() if which(tool) is None]
    if not (installer_found or has_installer)():
        missing.append(INSTALLER[1])
    return missing


def has_installer() -> bool:
    """Debian's python3 can run `-m installer` (python3-installer): it installs the wheels
    into the image with the image's interpreter paths, as pip would there."""
    probe = subprocess.run([INSTALLER[0], "-c", "import installer"], capture_output=True,
                           timeout=STEP_TIMEOUT_S)
    return probe.returncode == 0


def require_tools() -> None:
    missing = missing_tools()
    if missing:
        raise ImageError(f"the image build needs {', '.join(missing)}, not installed: run "
                         f"'./dev setup' (or 'apt-get install {' '.join(missing)}')")


def pinned_dependencies(name: str = "gdrprobe", requires=importlib.metadata.requires,
                        installed=importlib.metadata.version) -> list[str]:
    """`name`'s run-time dependency closure (no extras) as `dist==version`, at the versions
    installed here: the image gets what this checkout's tests ran with."""
    pins: dict[str, str] = {}
    pending = [name]
    while pending:
        for line in requires(pending.pop()) or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            key = requirement.name.lower().replace("_", "-")
            if key not in pins:
                pins[key] = installed_version(installed, requirement.name)
                pending.append(requirement.name)
    return sorted(f"{dist}=={pin}" for dist, pin in pins.items())


def installed_version(installed, dist: str) -> str:
    try:
        return installed(dist)
    except importlib.metadata.PackageNotFoundError as error:
        raise ImageError(f"{dist}, which gdrprobe needs, is not installed in this venv: run "
                         "'./dev setup'") from error


def current_key(repo: str = REPO) -> str:
    """The image's inputs: the wheel's (its sources and how lab/package.py builds it), the
    pinned dependencies and this recipe."""
    sources = {}
    for name in wheel_source_files(repo):
        with open(os.path.join(repo, name), "rb") as handle:
            sources[name] = handle.read()
    recipe = b""
    for module in (__file__, package.__file__):
        with open(os.path.abspath(module), "rb") as handle:
            recipe += handle.read()
    return cache_key(sources, pinned_dependencies(), recipe)


def mmdebstrap_argv(rootfs: str) -> list[str]:
    argv = ["mmdebstrap", f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}",
            f"--hook-dir={MERGED_USR_HOOKS}"]
    argv += [f"--dpkgopt={option}" for option in DPKG_OPTIONS]
    return argv + [SUITE, rootfs, *SOURCES]


def labels(tag: str) -> dict[str, str]:
    """The OCI pre-defined annotation keys (image-spec annotations.md), set as labels."""
    return {"org.opencontainers.image.title": "gdrprobe",
            "org.opencontainers.image.description":
                f"Prove whether GPUDirect RDMA is engaged; Debian {SUITE} by mmdebstrap",
            "org.opencontainers.image.version": tag,
            "org.opencontainers.image.licenses": "Apache-2.0"}


def umoci_config_argv(image: str, tag: str) -> list[str]:
    argv = ["umoci", "config", "--image", image, "--os", "linux", "--architecture", "amd64",
            "--config.entrypoint", ENTRYPOINT, "--config.cmd", DEFAULT_COMMAND,
            "--config.env", f"PATH={ENV_PATH}", "--config.workingdir", "/"]
    for key, value in labels(tag).items():
        argv += ["--config.label", f"{key}={value}"]
    return argv


def make_rootfs(rootfs: str) -> None:
    try:
        step(mmdebstrap_argv(rootfs), "the Debian root filesystem", MMDEBSTRAP_TIMEOUT_S)
    except ImageError as error:
        mirrors = ", ".join(sorted({line.split()[1] for line in SOURCES}))
        raise ImageError(f"{error}\nmmdebstrap downloads Debian {SUITE} from {mirrors}: are "
                         "they reachable from here?") from error


def check_same_python(rootfs: str) -> None:
    """The wheel's extension is built by this venv's Python; the image's must be the same
    minor version, or the extension would not load there."""
    here = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    found = glob.glob(os.path.join(rootfs, "usr/lib/python3.*"))
    there = sorted(os.path.basename(path) for path in found)
    if here not in there:
        raise ImageError(f"the image's Python is {', '.join(there) or 'missing'} but this venv "
                         f"runs {here}: build on Debian {SUITE}, whose python3 is the image's")


def build_wheels(work: str, pins: list[str]) -> list[str]:
    """gdrprobe's wheel as `./dev package` builds it (lab/package.py: from its sdist, the one
    an operator installs), and the pinned dependencies' wheels for this Python, from PyPI."""
    wheels = os.path.join(work, "wheels")
    os.makedirs(wheels)
    wheel, _sdist = package.ensure_dist()
    shutil.copy2(wheel, wheels)
    if pins:
        try:
            step([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                  "--only-binary=:all:", "-d", wheels, *pins],
                 "downloading the Python dependencies")
        except ImageError as error:
            raise ImageError(f"{error}\nis PyPI (or pip's configured index) reachable?") from error
    return sorted(glob.glob(os.path.join(wheels, "*.whl")))


def install_wheels(rootfs: str, wheels: list[str]) -> None:
    for wheel in wheels:
        step([INSTALLER[0], "-m", "installer", "--destdir", rootfs, wheel],
             f"installing {os.path.basename(wheel)} into the image")
    # The smoke test: the image's own Python loads the native layer, pyverbs and what the
    # deploy/ monitors call (prometheus_client).
    step(["chroot", rootfs, "/usr/bin/python3", "-c",
          "import gdrprobe._native, pyverbs.device, cuda.bindings.driver, prometheus_client"],
         "importing gdrprobe in the image")
    if not os.path.isfile(os.path.join(rootfs, ENTRYPOINT.lstrip("/"))):
        raise ImageError(f"the wheel installed no {ENTRYPOINT}: see [project.scripts]")


def make_archive(rootfs: str, layout: str, bundle: str, archive: str, tag: str) -> None:
    image = f"{layout}:{tag}"
    step(["umoci", "init", "--layout", layout], "the OCI layout")
    step(["umoci", "new", "--image", image], "the OCI layout")
    step(["umoci", "insert", "--image", image, rootfs, "/"], "the image's layer")
    step(umoci_config_argv(image, tag), "the image's configuration")
    step(["umoci", "gc", "--layout", layout], "the OCI layout")
    # The oci-archive: the layout's files at the tar's top level.
    step(["tar", "--sort=name", "--numeric-owner", "-C", layout, "-cf", archive, "."],
         "the oci-archive")
    step(["umoci", "unpack", "--image", image, bundle], "unpacking the image again")


def build(key: str) -> str:
    """Build the image for `key` in a scratch directory, then move it into place."""
    require_tools()
    tag = version()
    os.makedirs(IMAGE_DIR, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"{key}.partial-", dir=IMAGE_DIR)
    started = time.monotonic()

    def progress(what: str) -> None:
        print(f"image: {time.monotonic() - started:4.0f} s  {what}", flush=True)

    try:
        rootfs = os.path.join(work, "rootfs")
        progress(f"Debian {SUITE} with {', '.join(PACKAGES)} (mmdebstrap)")
        make_rootfs(rootfs)
        check_same_python(rootfs)
        progress("gdrprobe's wheel and its dependencies")
        install_wheels(rootfs, build_wheels(work, pinned_dependencies()))
        progress("the OCI layout and archive (umoci)")
        result = os.path.join(work, "result")
        os.makedirs(result)
        make_archive(rootfs, os.path.join(work, "layout"), os.path.join(result, "bundle"),
                     os.path.join(result, archive_name(tag)), tag)
        final = os.path.join(IMAGE_DIR, key)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(result, final)
        progress(f"built {key}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def ensure_image() -> str:
    """The archive's path, built unless this checkout's image is in the cache."""
    key = current_key()
    directory = os.path.join(IMAGE_DIR, key)
    archive = os.path.join(directory, archive_name(version()))
    if os.path.isfile(archive):
        print(f"image: cached ({key})", flush=True)
    else:
        build(key)
    point_latest_at(IMAGE_DIR, key)
    return archive


def main() -> int:
    try:
        print(ensure_image())
    except ImageError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
