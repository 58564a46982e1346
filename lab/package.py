"""`./dev package`: gdrprobe's sdist and wheel, built as an operator's pip would build them, and
the wheel installed into a clean virtual environment and run.

The build is PyPA's `python -m build` on a copy of the files the package is made from
(wheel_source_files: nothing the checkout built is an input): the sdist first,
then the wheel from the unpacked sdist, each in an isolated environment with only
pyproject.toml's build requirements, so a file the sdist forgets fails here, not on a node.
The wheel is CPython's and the machine's (`cp311-cp311-linux_x86_64` on Debian 12): its
extension links the system's libibverbs.so.1, whose providers must match the node's
rdma-core, so it is built for a site's own index or copied to its nodes, not uploaded to
PyPI as a manylinux wheel (docs/install.md).

Both land in .lab-cache/dist/KEY/, KEY a hash of every input (the sources and this recipe),
and `latest` names the newest: a second build of the same checkout is a look-up. The smoke
test runs every time: a fresh venv (no system site packages: what pip resolves from the
wheel's metadata alone), the wheel installed into it, then `gdrprobe --version`, `--help`
and `gdrprobe doctor` from that venv (the doctor needs neither pyverbs nor a GPU). The
image (lab/image.py) is built from this wheel.

    python -m lab.package          build (or find) the sdist and wheel, smoke-test the wheel
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time

from lab.kernel import CACHE, REPO, LabError

DIST_DIR = os.path.join(CACHE, "dist")
# The files the package is built from (pyproject.toml's metadata names the README;
# MANIFEST.in says what the sdist carries).
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE*",
                 "gdrprobe", "csrc")
# The isolated build environments fetch setuptools and Cython from the index; the
# extension's compile takes about a minute on two loaded cores.
BUILD_TIMEOUT_S = 1200
INSTALL_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120
BASE_PYTHON = "/usr/bin/python3"       # the system's, as docs/install.md's venv is made
# The doctor's exit codes that are answers about the machine (0 nothing failed, 1 a check
# failed): anything else (3, 70, a traceback's 1 without a report) is the package's fault.
DOCTOR_ANSWERS = (0, 1)


class BuildError(LabError):
    """A build (the package, the image) failed; the message names the cause and the fix."""


class PackageError(BuildError):
    """The package could not be built or does not run."""


def version() -> str:
    """gdrprobe's version as this checkout's venv installed it: the package's and the
    image's tag."""
    return importlib.metadata.version("gdrprobe")


def run_step(argv: list[str], what: str, timeout: float, error=PackageError, **kwargs) -> str:
    """One command, bounded; its failure raises `error` with the tail of its output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as expired:
        raise error(f"{what}: '{argv[0]}' did not end within {timeout:.0f} s") from expired
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise error(f"{what}: '{' '.join(argv[:3])} ...' exited {done.returncode}:\n{tail}")
    return done.stdout


def wheel_source_files(repo: str = REPO) -> list[str]:
    """Every file the package is built from, relative to the checkout: git's tracked and
    untracked-but-not-ignored files under WHEEL_SOURCES, so build outputs (the .so, the
    generated C) are never an input."""
    listing = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard", "--", *WHEEL_SOURCES],
                             capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if listing.returncode != 0:
        raise BuildError(f"'git ls-files' failed in {repo}: {listing.stderr.strip()}; the "
                         "package is built from a git checkout of gdrprobe")
    files = sorted({name for name in listing.stdout.split("\0") if name})
    return [name for name in files if os.path.isfile(os.path.join(repo, name))]


def cache_key(sources: dict[str, bytes], pins: list[str], recipe: bytes) -> str:
    """A hash of every input: the recipe, the pinned Python dependencies, and the package's
    source files, each name with a hash of its content (a newline ends a pin and a NUL a
    name: neither can hold one)."""
    digest = hashlib.sha256(hashlib.sha256(recipe).digest())
    for pin in pins:
        digest.update(pin.encode() + b"\n")
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + hashlib.sha256(sources[name]).digest())
    return digest.hexdigest()[:16]


def current_key() -> str:
    sources = {}
    for name in wheel_source_files():
        with open(os.path.join(REPO, name), "rb") as handle:
            sources[name] = handle.read()
    with open(os.path.abspath(__file__), "rb") as handle:
        recipe = handle.read()
    return cache_key(sources, [], recipe)


def artifacts(directory: str) -> tuple[str, str] | None:
    """(wheel, sdist) in directory, or None where either is missing."""
    wheels = glob.glob(os.path.join(directory, "gdrprobe-*.whl"))
    sdists = glob.glob(os.path.join(directory, "gdrprobe-*.tar.gz"))
    return (wheels[0], sdists[0]) if len(wheels) == 1 and len(sdists) == 1 else None


def build(key: str) -> str:
    """`python -m build` (sdist, then the wheel from it) on a copy of the sources, into a
    scratch directory moved into place whole."""
    os.makedirs(DIST_DIR, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"{key}.partial-", dir=DIST_DIR)
    try:
        source = os.path.join(work, "src")
        for name in wheel_source_files():
            os.makedirs(os.path.dirname(os.path.join(source, name)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), os.path.join(source, name))
        out = os.path.join(work, "dist")
        try:
            run_step([sys.executable, "-m", "build", "--outdir", out, source],
                 "python -m build", BUILD_TIMEOUT_S)
        except PackageError as error:
            raise PackageError(f"{error}\n(is pip's index reachable for the build "
                               "requirements? is 'build' installed: ./dev setup?)") from error
        if artifacts(out) is None:
            raise PackageError(f"python -m build left no single wheel and sdist in {out}")
        final = os.path.join(DIST_DIR, key)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def point_latest_at(directory: str, key: str) -> None:
    """`latest` in a cache directory (the package's, the image's) names its newest build;
    older ones are removed (an image is about 400 MB)."""
    latest = os.path.join(directory, "latest")
    link = latest + ".new"
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(key, link)
    os.replace(link, latest)
    for entry in os.listdir(directory):
        if entry not in (key, "latest") and not entry.endswith(".new"):
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


def ensure_dist() -> tuple[str, str]:
    """(wheel, sdist) of this checkout, built unless the cache has them."""
    key = current_key()
    directory = os.path.join(DIST_DIR, key)
    found = artifacts(directory)
    if found is None:
        found = artifacts(build(key))
    else:
        print(f"package: cached ({key})", flush=True)
    point_latest_at(DIST_DIR, key)
    return found


def smoke(wheel: str, python: str = BASE_PYTHON) -> list[str]:
    """The wheel in a clean venv: installed with its dependencies as pip resolves them, then
    run. Returns what each command said (first line)."""
    said = []
    with tempfile.TemporaryDirectory(prefix="gdrprobe-wheel-venv-") as venv:
        run_step([python, "-m", "venv", venv], "a clean venv", RUN_TIMEOUT_S)
        run_step([os.path.join(venv, "bin", "pip"), "install", "-q", wheel],
             f"installing {os.path.basename(wheel)} into a clean venv", INSTALL_TIMEOUT_S)
        gdrprobe = os.path.join(venv, "bin", "gdrprobe")
        environment = {"PATH": "/usr/bin:/bin", "HOME": venv}
        shown = run_step([gdrprobe, "--version"], "gdrprobe --version", RUN_TIMEOUT_S,
                     env=environment).strip()
        if shown != f"gdrprobe {version()}":
            raise PackageError(f"the installed wheel says {shown!r}, not gdrprobe {version()}")
        said.append(shown)
        said.append(run_step([gdrprobe, "--help"], "gdrprobe --help", RUN_TIMEOUT_S,
                         env=environment).splitlines()[0])
        doctor = subprocess.run([gdrprobe, "doctor"], capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S, env=environment)
        if doctor.returncode not in DOCTOR_ANSWERS or "Traceback" in doctor.stderr:
            raise PackageError(f"gdrprobe doctor from the wheel exited {doctor.returncode}:\n"
                               f"{doctor.stderr.strip()[-2000:]}")
        said.append(f"gdrprobe doctor (exit {doctor.returncode}): "
                    f"{doctor.stdout.splitlines()[0] if doctor.stdout else ''}")
    return said


def main() -> int:
    started = time.monotonic()
    try:
        wheel, sdist = ensure_dist()
        print(f"package: {wheel}\npackage: {sdist}", flush=True)
        for line in smoke(wheel):
            print(f"package: from a clean venv: {line}", flush=True)
    except BuildError as error:
        print(f"package: {error}", file=sys.stderr)
        return 1
    print(f"package: passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
