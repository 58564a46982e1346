"""Build, for the lab's kernel, what sends the DMA-BUF arm through the kernel's dma-buf import
path with host pages behind it (docs/dmabuf-lab.md):

- rdma_rxe.ko: Debian's Soft-RoCE with reg_user_mr_dmabuf, and the rails guest's PCI parent,
  shaper and time-out knobs (lab/dmabuf/rxe/; lab/rails.py);
- gdr_dmabuf.ko: a dma-buf exporter over memfd pages, with a fault switch (lab/dmabuf/exporter/);
- gdr_pci_standin.ko: PCI functions shown as NVIDIA GPUs, for the rails guest (lab/dmabuf/exporter/);
- libgdr_rxe_dmabuf.so: the user-space half Debian 12's rxe provider lacks (lab/dmabuf/verbs/).

Sources and headers come from Debian's packages only, for the lab kernel's exact version:
linux-source-6.1 (of which only drivers/infiniband/sw/rxe is unpacked),
linux-headers-<release> with the -common and linux-kbuild-6.1 packages it depends on. They
are unpacked (never installed) under .lab-cache/modules/<release>/tree, and each build lands
in .lab-cache/modules/<release>/<digest of its inputs>, so a second run builds nothing.

  python -m lab.modules             build (or reuse) and print the folder holding the four files
  python -m lab.modules guest-demo [cuda] [rocm]
                                    in a lab guest after 'lab/dmabuf/guest.sh load FOLDER': the
                                    A/B with --mem dmabuf over each stand-in GPU runtime (default
                                    cuda), its JSON and the kernel's dma-buf table
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

from lab import dmabuf_rows
from lab.dmabuf_guest import (BUFINFO, DEMO_REPEATS, EXPORTER_MODULE, PCI_STANDIN_MODULE, RUNTIMES,
                              RXE_MODULE, SOURCES, VERBS_LIBRARY, Built, answered_by_dmabuf,
                              run_dmabuf_ab)
from lab.kernel import CACHE, LabError, ensure_kernel, run

RXE_SOURCE = "drivers/infiniband/sw/rxe"
SOURCE_PACKAGE = "linux-source-6.1"
PRODUCTS = (RXE_MODULE, EXPORTER_MODULE, PCI_STANDIN_MODULE, VERBS_LIBRARY)
# The source tarball alone is about 140 MB compressed: unpacking the rxe folder reads it whole.
UNPACK_TIMEOUT_S = 600


def kernel_release(image: str) -> str:
    """6.1.0-57-amd64 from .../boot/vmlinuz-6.1.0-57-amd64."""
    name = os.path.basename(image)
    if not name.startswith("vmlinuz-") or len(name) == len("vmlinuz-"):
        raise LabError(f"{image} is not named vmlinuz-<release>")
    return name[len("vmlinuz-"):]


def header_dependencies(depends: str) -> list[tuple[str, str]]:
    """(package, exact version) pairs a linux-headers package pins with '(= version)' or
    asks at least with '(>= version)', from its Depends field; others (the compiler) are the
    build machine's business."""
    pairs = []
    for clause in depends.split(","):
        match = re.fullmatch(r"\s*([a-z0-9.+-]+)\s*\((=|>=)\s*([^)\s]+)\)\s*", clause)
        if match and match.group(1).startswith(("linux-headers-", "linux-kbuild-")):
            pairs.append((match.group(1), match.group(3)))
    return pairs


def input_digest(package_version: str, folder: str = SOURCES) -> str:
    """What a build depends on: the kernel packages' version and every file under
    lab/dmabuf (names and contents), so an edit there builds again."""
    digest = hashlib.sha256(package_version.encode())
    for path in sorted(glob.glob(os.path.join(folder, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            digest.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(handle.read())
    return digest.hexdigest()[:16]


def vermagic_matches(vermagic: str, release: str) -> bool:
    """A module loads into the kernel whose release opens its vermagic
    (kernel/module/version.c compares the whole string; its first word is the release)."""
    return vermagic.split()[:1] == [release]


def download(packages: list[str], folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o777)   # apt downloads as _apt
    result = run(["apt-get", "download", *packages], cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"apt-get download {' '.join(packages)} failed: {result.stderr.strip()}"
                       " (is the lab kernel's version still on the Debian mirror? 'python -m "
                       "lab kernel' after removing .lab-cache/kernel fetches the current one)")
    debs = []
    for package in packages:
        name = package.split("=")[0]
        found = glob.glob(os.path.join(folder, f"{name}_*.deb"))
        if not found:
            raise LabError(f"apt-get download left no {name}_*.deb in {folder}")
        debs.append(found[0])
    return debs


def package_version(release: str) -> str:
    """The Debian version of linux-headers-<release> on the mirror (the image's own)."""
    result = run(["apt-cache", "show", "--no-all-versions", f"linux-headers-{release}"],
                 capture_output=True, text=True)
    match = re.search(r"^Version: (\S+)$", result.stdout, re.MULTILINE)
    if not match:
        raise LabError(f"apt-cache does not know linux-headers-{release}: run 'apt-get update'")
    return match.group(1)


def unpack_headers(release: str, version: str, downloads: str, tree: str) -> None:
    """Headers, their -common half and kbuild, unpacked into tree."""
    headers_deb, = download([f"linux-headers-{release}={version}"], downloads)
    depends = run(["dpkg-deb", "-f", headers_deb, "Depends"], capture_output=True, text=True,
                  check=True).stdout
    debs = [headers_deb] + download([f"{name}={need}" for name, need
                                     in header_dependencies(depends)], downloads)
    for deb in debs:
        run(["dpkg-deb", "-x", deb, tree], check=True)
        os.remove(deb)


def unpack_rxe_source(version: str, downloads: str, tree: str) -> None:
    """drivers/infiniband/sw/rxe from linux-source-6.1's tarball, into tree/rxe."""
    deb, = download([f"{SOURCE_PACKAGE}={version}"], downloads)
    staging = os.path.join(tree, "source-deb")
    run(["dpkg-deb", "-x", deb, staging], check=True)
    os.remove(deb)
    tarballs = glob.glob(os.path.join(staging, "usr", "src", "linux-source-*.tar.xz"))
    if not tarballs:
        raise LabError(f"{SOURCE_PACKAGE} {version} holds no usr/src/linux-source-*.tar.xz")
    target = os.path.join(tree, "rxe")
    os.makedirs(target)
    with tarfile.open(tarballs[0]) as tar:
        for member in tar:
            head, _, name = member.name.rpartition("/")
            if head.endswith("/" + RXE_SOURCE) and member.isfile():
                with tar.extractfile(member) as source, \
                        open(os.path.join(target, name), "wb") as copy:
                    shutil.copyfileobj(source, copy)
    shutil.rmtree(staging)
    if not os.path.exists(os.path.join(target, "rxe_verbs.c")):
        raise LabError(f"{SOURCE_PACKAGE} {version} has no {RXE_SOURCE}/rxe_verbs.c")


def ensure_tree(release: str, version: str) -> str:
    """The unpacked headers and rxe source for release (fetched once); returns the tree."""
    tree = os.path.join(CACHE, "modules", release, "tree")
    if os.path.exists(os.path.join(tree, "ready")):
        return tree
    partial = tree + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    downloads = os.path.join(CACHE, "downloads")
    unpack_headers(release, version, downloads, partial)
    unpack_rxe_source(version, downloads, partial)
    # Debian's headers Makefile includes the -common one by its installed path under
    # /usr/src: point it at the unpacked copy, where it will stay.
    makefile = os.path.join(partial, "usr", "src", f"linux-headers-{release}", "Makefile")
    with open(makefile) as handle:
        text = handle.read()
    with open(makefile, "w") as handle:
        handle.write(text.replace("include /usr/src/", f"include {tree}/usr/src/"))
    with open(os.path.join(partial, "ready"), "w") as handle:
        handle.write(version + "\n")
    shutil.rmtree(tree, ignore_errors=True)
    os.rename(partial, tree)
    return tree


def kbuild(headers: str, folder: str, extra: list[str]) -> None:
    argv = ["make", "-C", headers, f"M={folder}", f"-j{os.cpu_count() or 1}", *extra, "modules"]
    result = run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"building {folder} failed ('{' '.join(argv)}'):\n"
                       f"{result.stdout[-3000:]}{result.stderr[-3000:]}")


def build_rxe(tree: str, headers: str, work: str) -> str:
    folder = os.path.join(work, "rxe")
    shutil.copytree(os.path.join(tree, "rxe"), folder)
    patch = os.path.join(SOURCES, "rxe", "rxe-dmabuf.patch")
    result = run(["patch", "-p0", "-d", folder, "-i", patch], capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"{patch} does not apply to this kernel's rxe:\n{result.stdout}")
    for source in ("rxe_dmabuf.c", "rxe_rails.c"):
        shutil.copy(os.path.join(SOURCES, "rxe", source), folder)
    kbuild(headers, folder, ["CONFIG_RDMA_RXE=m"])
    return os.path.join(folder, RXE_MODULE)


def build_exporter(headers: str, work: str) -> list[str]:
    """The exporter and the PCI stand-in (one Kbuild folder)."""
    folder = os.path.join(work, "exporter")
    shutil.copytree(os.path.join(SOURCES, "exporter"), folder)
    shutil.copy(os.path.join(SOURCES, "gdr_dmabuf_uapi.h"), folder)
    kbuild(headers, folder, [])
    return [os.path.join(folder, EXPORTER_MODULE), os.path.join(folder, PCI_STANDIN_MODULE)]


def build_verbs_library(work: str) -> str:
    output = os.path.join(work, VERBS_LIBRARY)
    argv = ["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-o", output,
            os.path.join(SOURCES, "verbs", "rxe_dmabuf_verbs.c"), "-libverbs", "-ldl"]
    result = run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"'{' '.join(argv)}' failed (libibverbs-dev installed?):\n{result.stderr}")
    return output


def check_vermagic(module: str, release: str) -> None:
    vermagic = run(["modinfo", "-F", "vermagic", module], capture_output=True, text=True).stdout
    if not vermagic_matches(vermagic, release):
        raise LabError(f"{module} was built for '{vermagic.strip()}', not {release}: the "
                       "headers do not match the lab kernel")


def built_modules(release: str) -> Built | None:
    """The build for release and today's inputs if one is in the cache, without fetching or
    building (what a lab guest, which cannot build, looks up)."""
    ready = os.path.join(CACHE, "modules", release, "tree", "ready")
    if not os.path.exists(ready):
        return None
    with open(ready) as handle:
        version = handle.read().strip()
    built = Built(os.path.join(CACHE, "modules", release, input_digest(version)))
    return built if all(os.path.exists(built.path(name)) for name in PRODUCTS) else None


def ensure_modules() -> Built:
    """The products for the lab kernel, built once per kernel version and inputs."""
    try:
        return build_modules()
    except subprocess.CalledProcessError as error:   # dpkg-deb or modinfo refused
        raise LabError(f"'{' '.join(map(str, error.cmd))}' failed: {error.stderr or ''}") \
            from error


def build_modules() -> Built:
    release = kernel_release(ensure_kernel())
    version = package_version(release)
    built = Built(os.path.join(CACHE, "modules", release, input_digest(version)))
    if all(os.path.exists(built.path(name)) for name in PRODUCTS):
        return built
    tree = ensure_tree(release, version)
    headers = os.path.join(tree, "usr", "src", f"linux-headers-{release}")
    work = built.folder + ".partial"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    products = [build_rxe(tree, headers, work), *build_exporter(headers, work),
                build_verbs_library(work)]
    for module in (product for product in products if product.endswith(".ko")):
        check_vermagic(module, release)
    shutil.rmtree(built.folder, ignore_errors=True)
    os.makedirs(built.folder)
    for product in products:
        shutil.copy(product, built.folder)
    shutil.rmtree(work)
    remove_older_builds(built)
    return built


def remove_older_builds(built: Built) -> None:
    """Builds of earlier inputs for this kernel (about 11 MB each) are never used again."""
    kernel_folder = os.path.dirname(built.folder)
    for name in os.listdir(kernel_folder):
        path = os.path.join(kernel_folder, name)
        if name != "tree" and path != built.folder and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def guest_demo(runtimes: list[str]) -> int:
    """The A/B with --mem dmabuf over each stand-in runtime in turn: its JSON, then the
    kernel's dma-buf table taken during the run; 0 only when each DMA-BUF arm measured a
    non-drain answer (answered_by_dmabuf) with a dma-buf attached to rxe."""
    built = built_modules(os.uname().release)
    if built is None:
        print("lab.modules: no build for this kernel: run 'python -m lab.modules' on the host",
              file=sys.stderr)
        return 3
    return max(demo_one(built, runtime) for runtime in runtimes)


def demo_one(built: Built, runtime: str) -> int:
    print(f"==== the A/B over the stand-in {'HIP runtime (ROCm)' if runtime == 'rocm' else 'libcuda.so.1'}: "
          "the kernel's dma-buf path is real, the GPU is not: not GPU proof ====")
    try:
        done, table = run_dmabuf_ab(built, repeats=DEMO_REPEATS, runtime=runtime)
    except LabError as error:
        print(f"lab.modules: {error}", file=sys.stderr)
        return 3
    print(done.stdout.rstrip())
    print(f"---- {BUFINFO} during the run ----")
    print(table.rstrip() or "(no dma-buf was attached to rxe during the run)")
    if done.stderr.strip():
        print(done.stderr.rstrip(), file=sys.stderr)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return 1
    verdict = report.get("verdict") or {}
    print(f"{runtime} stand-in verdict: {verdict.get('classification')} via {verdict.get('mechanism')} "
          f"(exit {verdict.get('exit_code')}); a stand-in runtime over host pages, not GPU proof")
    code = 0 if answered_by_dmabuf(report) and table else 1
    if runtime == "cuda":   # the rows past the WRITE A/B, once (lab/dmabuf_rows.py)
        print("---- latency, READ, both directions and the flush, GPU memory at both ends ----")
        code = max(code, dmabuf_rows.show(built))
    return code


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == ["guest-demo"]:
        runtimes = args[1:] or ["cuda"]
        unknown = sorted(set(runtimes) - set(RUNTIMES))
        if unknown:
            print(f"lab.modules: guest-demo takes {' and '.join(RUNTIMES)}, not {', '.join(unknown)}",
                  file=sys.stderr)
            return 2
        return guest_demo(runtimes)
    try:
        print(ensure_modules().folder)
    except LabError as error:
        print(f"lab.modules: {error}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
