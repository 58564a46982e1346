"""The libnccl the job will load, found without loading it, and its version.

A job asks the dynamic loader for ``libnccl.so.2`` (NCCL's soname, ``makefiles/common.mk``)
from the library that links NCCL: in a PyTorch job, one of ``torch/lib`` (libtorch_cuda.so).
The file it gets is found the way glibc's loader finds it for that library
(:mod:`gdrprobe.doctor.facts.dynamic_loader`): LD_PRELOAD, the library's DT_RPATH and the
Python executable's (only without a DT_RUNPATH), LD_LIBRARY_PATH, the library's DT_RUNPATH,
``/etc/ld.so.cache``, the default directories. The RPATH and RUNPATH are read from the
library's own dynamic section (:mod:`gdrprobe.doctor.facts.elf_dynamic`): PyTorch's pip
wheels carry ``$ORIGIN/../../nvidia/nccl/lib`` as DT_RPATH (``.ci/manywheel/build_cuda.sh``
CUDA_RPATHS, ``build_common.sh`` patchelf ``--force-rpath``), an NGC image's torch names no
wheel, so a wheel installed beside the image's libnccl is not what it loads. The libraries
between torch's ``_C`` and the one that asks carry the same DT_RPATH in that build, so the
chain glibc walks is that library's, then the executable's. Before any of this, torch may
open a wheel's libnccl itself (:mod:`gdrprobe.doctor.facts.torch_preload`); a torch that no
library of which asks for ``libnccl.so.2`` has NCCL linked in (PyTorch's USE_STATIC_NCCL).
A Python without torch is taken to load the NCCL wheel of its site-packages (and a conda
environment its ``lib/``) as a RUNPATH would; a program that is no Python has no RUNPATH.

``--nccl PATH`` names the library itself (or the directory holding it), or the job's Python
(:mod:`gdrprobe.doctor.facts.pythons`). Without it the answer depends on which Python runs
the job: every Python found is looked at, the default answer is the first with torch (else
the first that finds a libnccl), and each candidate's library is reported.

The version comes from the file name (``libnccl.so.2.21.5``, what NCCL's build installs),
else the wheel's metadata (``nvidia_nccl_cu12-2.21.5.dist-info``, the one whose RECORD
lists the file), else the string NCCL keeps in its bytes ("NCCL version 2.21.5+cuda12.4",
``src/init.cc`` VERSION_STRING), which also decides when two wheels' RECORDs list the same
file (nvidia-nccl-cu12 and -cu13 install the same path; the last one unpacked owns it).
On an AMD node the job's librccl is found the same way (:data:`RCCL` says how ROCm and
PyTorch's ROCm wheels lay it out), its version read from its bytes ("RCCL version : 2.21.5").
Every file is read through the root; what a capture cannot keep (a version deep in a
library's bytes, the dynamic section of a library of a gigabyte) is captured as a fact.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping
from typing import NamedTuple

from gdrprobe.doctor.facts.dynamic_loader import LoadingObject, places, resolve
from gdrprobe.doctor.facts.elf_dynamic import Dynamic, ElfUnreadable, read_dynamic
from gdrprobe.doctor.facts.pythons import Python, candidate_pythons, python_at
from gdrprobe.doctor.facts.torch_preload import SOURCE_LIMIT, cuda_major, preloaded_nccl, read_preload
from gdrprobe.nccl.rccl import rccl_rules
from gdrprobe.nccl.versions import NcclRules, parse_version
from gdrprobe.report.model import NcclCandidate, NcclLibrary
from gdrprobe.sysroot import SysRoot

# PyTorch's CMake targets torch_global_deps (opened first by torch/__init__.py), torch_cuda, torch.
TORCH_LIBRARIES = ("libtorch_global_deps.so", "libtorch_cuda.so", "libtorch.so")
MAX_TORCH_LIBRARIES = 32
GLOBAL_DEPS = "libtorch_global_deps.so"
NO_PYTHON = "a program that is no Python (nccl-tests, a C++ job)"
VERSION_TEXT = 32                # "2.21.5+cuda12.4" and its NUL fit
SCAN_CHUNK = 8 << 20
SCAN_LIMIT = 2 << 30             # NCCL's libraries are a few hundred MiB, libtorch_cuda.so about one GiB
ROCM_DEFAULT = "/opt/rocm"


@dataclasses.dataclass(frozen=True)
class Collective:
    """How one collective library is installed and named: NCCL, or RCCL on an AMD node."""

    name: str
    sonames: tuple[str, ...]            # what a library asks the loader for; the first by default
    torch_libraries: tuple[str, ...]    # torch's libraries that link it, in the order looked at
    version_mark: bytes                 # the string before its version in its bytes
    package_dirs: Mapping[str, str]     # directory -> who installs it there
    versioned_name: re.Pattern | None   # a file name that holds the version
    wheel_dir: str | None               # a pip wheel's directory in site-packages
    wheel_metadata: re.Pattern | None
    torch_preloads: bool                # torch/__init__.py may open a wheel's copy itself

    @property
    def prefix(self) -> str:
        return self.sonames[0].split(".")[0]

    def is_library(self, path: str) -> bool:
        return posixpath.basename(path).startswith(self.prefix)

    def rules(self, version: str | None, path: str | None = None) -> NcclRules:
        """The rules of this library at ``version`` (as its bytes or name state it); RCCL's
        also by the ROCm release its file name states (``path``, resolved)."""
        parsed = parse_version(version)
        if self.name == "RCCL":
            return rccl_rules(parsed, path)
        return NcclRules(parsed)


NCCL = Collective(
    "NCCL", ("libnccl.so.2",), TORCH_LIBRARIES, b"NCCL version ",
    {"/usr/lib/x86_64-linux-gnu": "Debian/Ubuntu's libnccl2", "/usr/lib/aarch64-linux-gnu": "Debian/Ubuntu's libnccl2",
     "/usr/lib64": "RHEL's libnccl"},
    re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$"), "nvidia/nccl/lib",
    re.compile(r"nvidia_nccl_cu\d+-(\d+\.\d+\.\d+)[^/]*\.dist-info$"), True)
# RCCL (ROCm/rccl 0cbce2a7): CMakeLists.txt rocm_set_soversion(rccl "1.0") makes the soname
# librccl.so.1, the file librccl.so.1.0.<ROCm version> (no RCCL version in it); src/init.cc
# VERSION_STRING "RCCL version : 2.21.5" stays in its bytes. PyTorch's ROCm wheels
# (.ci/manywheel/build_rocm.sh, build_common.sh) copy /opt/rocm/lib's librccl.so into
# torch/lib, rename the NEEDED entries of torch's libraries (libtorch_hip.so) from
# librccl.so.1 to librccl.so and set their DT_RPATH to $ORIGIN. No pip wheel of RCCL's own,
# and torch/__init__.py preloads none.
RCCL = Collective(
    "RCCL", ("librccl.so.1", "librccl.so"), (GLOBAL_DEPS, "libtorch_hip.so", "libtorch.so"), b"RCCL version : ",
    {"/opt/rocm/lib": "ROCm's rccl package", "/usr/lib/x86_64-linux-gnu": "the distribution's librccl1",
     "/usr/lib64": "the distribution's rccl"},
    None, None, None, False)


class Answer(NamedTuple):
    """What one Python (or a program that is none) would load: every copy in the loader's
    order, the first the one it gets, each with the rule that finds it."""

    python: str
    copies: list[tuple[str, str]]
    torch: bool


def first_each(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    first: dict[str, str] = {}
    for path, rule in found:
        first.setdefault(path, rule)
    return list(first.items())


class Finder:
    """One search: the root, the process environment, and what was read from libraries'
    bytes (``read``, for a capture; a replay's ``captured`` facts are used first)."""

    def __init__(self, root: SysRoot, environ: Mapping[str, str], captured: Mapping, kind: Collective = NCCL):
        self.root, self.environ, self.kind = root, environ, kind
        self.captured_versions = dict(captured.get("versions_in_bytes", {}))
        self.captured_dynamic = dict(captured.get("elf_dynamic", {}))
        self.read: dict[str, dict] = {"versions_in_bytes": {}, "elf_dynamic": {}}
        self.versions: dict[str, tuple[str | None, str | None]] = {}

    # ---- facts from bytes ---------------------------------------------------------------

    def dynamic(self, path: str) -> Dynamic | None:
        if path in self.captured_dynamic:
            return Dynamic.from_fact(self.captured_dynamic[path])
        try:
            found = read_dynamic(self.root, path)
        except ElfUnreadable:
            return None
        self.read["elf_dynamic"][path] = found.as_fact()
        return found

    def loading_object(self, path: str | None, executable: bool = False) -> LoadingObject | None:
        dynamic = self.dynamic(path) if path and self.root.exists(path) else None
        return LoadingObject(path, dynamic, executable) if dynamic else None

    def version_text(self, path: str) -> str | None:
        text = version_in_bytes(self.root, path, self.kind.version_mark) or self.captured_versions.get(path)
        if text:
            self.read["versions_in_bytes"][path] = text
        return text

    # ---- what one Python loads ------------------------------------------------------------

    def answer(self, python: Python | None) -> Answer:
        found = [(entry, "LD_PRELOAD") for entry in self.environ.get("LD_PRELOAD", "").replace(":", " ").split()
                 if self.kind.is_library(entry) and self.root.exists(entry)]
        if python is None:
            return Answer(NO_PYTHON, first_each(found + self.search(None)), False)
        torch = next((posixpath.join(site, "torch") for site in python.sites
                      if self.root.listdir(posixpath.join(site, "torch"))), None)
        copies = self.torch_copies(python, torch) if torch else None
        if copies is None:
            copies = self.search(None, self.assumed_runpath(python))
        return Answer(python.name, first_each(found + copies), torch is not None)

    def search(self, loader: LoadingObject | None, after: list[tuple[str, str]] = (),
               executable: LoadingObject | None = None) -> list[tuple[str, str]]:
        tried = places(self.root, loader, executable, self.environ) + list(after)
        soname = self.asked_for(loader)
        return resolve(self.root, soname, tried, bool(loader and loader.dynamic.nodeflib),
                       self.package_note) + self.rocm_install(soname)

    def asked_for(self, loader: LoadingObject | None) -> str:
        """The name ``loader`` asks the loader for (the soname where it is no library of torch's)."""
        needed = loader.dynamic.needed if loader else ()
        return next((name for name in self.kind.sonames if name in needed), self.kind.sonames[0])

    def package_note(self, path: str) -> str:
        owner = self.kind.package_dirs.get(posixpath.dirname(path))
        return f" ({owner} installs it there)" if owner else ""

    def assumed_runpath(self, python: Python) -> list[tuple[str, str]]:
        """Without torch: the Python's NCCL wheel (and a conda environment's lib) as a RUNPATH;
        for RCCL, the conda environment's lib and ROCm's."""
        wheels = [(posixpath.join(site, self.kind.wheel_dir), f"the {self.kind.name} wheel of {python.name}")
                  for site in python.sites] if self.kind.wheel_dir else []
        return wheels + ([(python.conda_lib, f"the conda environment's lib ({python.name})")]
                         if python.conda_lib else [])

    def rocm_install(self, soname: str) -> list[tuple[str, str]]:
        """RCCL, last: ROCm's lib ($ROCM_PATH's, else /opt/rocm's), where ROCm installs it; the
        loader looks there only where the job's RUNPATH, LD_LIBRARY_PATH or ld.so.conf names
        it, each of which the places before this one already count."""
        if self.kind.name != "RCCL":
            return []
        rocm = self.environ.get("ROCM_PATH") or ROCM_DEFAULT
        path = posixpath.join(rocm, "lib", soname)
        return [(path, f"ROCm's lib ({rocm}/lib, $ROCM_PATH else {ROCM_DEFAULT}): where ROCm installs it, "
                       "taken to be on the job's path")] if self.root.exists(path) else []

    def torch_copies(self, python: Python, torch: str) -> list[tuple[str, str]] | None:
        """The copies in the order torch's loading meets them; None: torch's libraries could
        not be read (or hold no NCCL), so torch tells nothing."""
        loader = self.torch_loader(torch + "/lib")
        if loader is None:
            linked = self.static_nccl(torch + "/lib")
            return [(linked, f"linked into {linked} (no library of torch asks the loader for "
                             f"{' or '.join(self.kind.sonames)})")] if linked else None
        executable = self.loading_object(python.executable, executable=True)
        preloaded = self.torch_preloaded(python, torch, loader, executable)
        return ([preloaded] if preloaded else []) + self.search(loader, executable=executable)

    def torch_loader(self, lib: str) -> LoadingObject | None:
        """The library of torch that asks for libnccl.so.2 (librccl.so or librccl.so.1): the
        one torch opens first, then libtorch_cuda.so (libtorch_hip.so), libtorch.so, then any
        other of torch/lib (at most 32)."""
        known = self.kind.torch_libraries
        others = sorted(name for name in self.root.listdir(lib) if ".so" in name and name not in known)
        for name in known + tuple(others[:MAX_TORCH_LIBRARIES]):
            found = self.loading_object(posixpath.join(lib, name))
            if found and set(self.kind.sonames) & set(found.dynamic.needed):
                return found
        return None

    def static_nccl(self, lib: str) -> str | None:
        """A torch library that is an ELF object with NCCL's version string in its bytes."""
        for name in self.kind.torch_libraries[1:]:
            path = posixpath.join(lib, name)
            if self.loading_object(path) and self.version_text(path):
                return path
        return None

    def torch_preloaded(self, python: Python, torch: str, loader: LoadingObject,
                        executable: LoadingObject | None) -> tuple[str, str] | None:
        """The libnccl torch/__init__.py opens itself before ``loader`` asks, if it does."""
        if not self.kind.torch_preloads:
            return None
        source = self.root.read_bytes(torch + "/__init__.py", SOURCE_LIMIT)
        preload = read_preload(source.decode("utf-8", "replace") if source else None)
        deps = self.loading_object(posixpath.join(torch, "lib", GLOBAL_DEPS)) if preload else None
        if deps is None:
            return None
        found = {name: resolve(self.root, name, places(self.root, deps, executable, self.environ),
                               deps.dynamic.nodeflib) for name in deps.dynamic.needed if preload.failure_names(name)}
        missing = next((name for name, copies in found.items() if not copies), None)
        cudart = next((copies[0][0] for name, copies in found.items() if copies and name.startswith("libcudart")), "")
        sites, major = list(python.sites), cuda_major(self.root, torch)
        if missing is not None and preload.on_failure:
            path = preloaded_nccl(self.root, sites, preload.libraries, True, preload, major)
            why = f"{GLOBAL_DEPS} finds no {missing}"
        elif (missing is None and loader.path != deps.path and preload.on_success and preload.success_mark
              and preload.success_mark in cudart):
            path = preloaded_nccl(self.root, sites, preload.on_success, not preload.best_effort, preload, major)
            why = f"{GLOBAL_DEPS} loaded {cudart}"
        else:
            return None
        return (path, f"preloaded by {torch}/__init__.py from sys.path ({why})") if path else None

    # ---- the version ------------------------------------------------------------------------

    def version(self, path: str) -> tuple[str | None, str | None]:
        """(version, how it was read) of one file, read once."""
        if path not in self.versions:
            self.versions[path] = self.read_version(path)
        return self.versions[path]

    def read_version(self, path: str) -> tuple[str | None, str | None]:
        name = posixpath.basename(self.root.resolve(path))
        match = self.kind.versioned_name.search(name) if self.kind.versioned_name else None
        if match:
            return match.group(1), f"the file name {name}"
        owners = wheel_owners(self.root, path, self.kind) if self.kind.wheel_dir else []
        if len(owners) == 1:
            return owners[0][1], f"the wheel's metadata {owners[0][0]}"
        text = self.version_text(path)
        version = parse_version(text)
        claimed = f"; {' and '.join(info for info, _ in owners)} both list it" if owners else ""
        if version is None:
            return None, (f"its bytes name no version{claimed}" if owners else None)
        mark = self.kind.version_mark.decode()
        return ".".join(map(str, version)), f"the library's bytes (\"{mark}{text}\"){claimed}"

    def candidate(self, answer: Answer) -> NcclCandidate:
        if not answer.copies:
            return NcclCandidate(answer.python, None, None, "none found")
        path, rule = answer.copies[0]
        return NcclCandidate(answer.python, path, self.version(path)[0], rule)

    def library(self, answer: Answer, named: bool, candidates: tuple[NcclCandidate, ...] = ()) -> NcclLibrary:
        python = None if answer.python == "--nccl" else answer.python
        library = self.kind.name
        if not answer.copies:
            return NcclLibrary(None, None, f"looked in {looked_in(answer.python, self.kind)}", None,
                               differences=self.kind.rules(None).differences(), python=python, python_named=named,
                               candidates=candidates, library=library)
        (path, source), others = answer.copies[0], answer.copies[1:]
        version, how = self.version(path)
        return NcclLibrary(path, version, source, how, shadowed=tuple(f"{other} ({rule})" for other, rule in others),
                           differences=self.kind.rules(version).differences(), python=python,
                           python_named=named, candidates=candidates, library=library)


def looked_in(python: str, kind: Collective = NCCL) -> str:
    if python == "--nccl":
        return "the path --nccl names"
    if kind.name == "RCCL":
        return ("LD_PRELOAD, torch's libraries' RPATH and RUNPATH, LD_LIBRARY_PATH, /etc/ld.so.cache, the "
                "loader's default directories and ROCm's lib")
    return ("LD_PRELOAD, torch's libraries' RPATH and RUNPATH, LD_LIBRARY_PATH, the Python's NCCL wheel, "
            "/etc/ld.so.cache and the loader's default directories")


def wheel_owners(root: SysRoot, path: str, kind: Collective = NCCL) -> list[tuple[str, str]]:
    """(dist-info, version) of each nvidia-nccl wheel that installed ``path``: those whose
    RECORD lists it; if none does, every one there."""
    lib_dir = posixpath.dirname(path)
    if not lib_dir.endswith("/" + kind.wheel_dir):
        return []
    site = lib_dir[:-len(kind.wheel_dir) - 1]
    wheels = [(f"{site}/{name}", match.group(1)) for name in root.listdir(site)
              if (match := kind.wheel_metadata.match(name))]
    relative = posixpath.relpath(path, site)
    return [(info, version) for info, version in wheels
            if relative in record_paths(root.read(f"{info}/RECORD"))] or wheels


def record_paths(record: str | None) -> set[str]:
    """The files a wheel's RECORD lists (its first CSV field per line)."""
    return {line.split(",", 1)[0].strip('"') for line in (record or "").splitlines()}


def version_in_bytes(root: SysRoot, path: str, mark: bytes = NCCL.version_mark) -> str | None:
    """The "NCCL version x.y.z+cudaX.Y" string in the library's bytes ("RCCL version :
    x.y.z" in RCCL's), read in chunks."""
    try:
        handle = root.open(root.realpath(path))
    except OSError:
        return None
    tail, scanned = b"", 0
    with handle:
        while scanned < SCAN_LIMIT:
            chunk = handle.read(SCAN_CHUNK)
            window = tail + chunk
            at = window.find(mark)
            if at >= 0 and (not chunk or at + len(mark) + VERSION_TEXT <= len(window)):
                text = window[at + len(mark):at + len(mark) + VERSION_TEXT].split(b"\0")[0]
                return text.decode("ascii", "replace")
            if not chunk:
                return None
            tail, scanned = window[-(len(mark) + VERSION_TEXT):], scanned + len(chunk)
    return None


def default_answer(answers: list[Answer]) -> Answer:
    """The first Python whose torch finds a libnccl, else the first answer that finds one,
    else the last (the program that is no Python)."""
    return next((a for a in answers if a.torch and a.copies), None) or next(
        (a for a in answers if a.copies), answers[-1])


def named_library(root: SysRoot, hint: str, kind: Collective = NCCL) -> str | None:
    """The library ``--nccl`` names: a libnccl (librccl) file, or a directory holding its soname."""
    if kind.is_library(hint):
        return hint
    inside = next((posixpath.join(hint, name) for name in kind.sonames
                   if root.exists(posixpath.join(hint, name))), None)
    return inside


def find_nccl_library(root: SysRoot, environ: Mapping[str, str], search: Mapping,
                      kind: Collective = NCCL) -> tuple[NcclLibrary, dict]:
    """The library the job will load (or where none was found), and what was read from
    libraries' bytes for a capture to keep. ``search``: ``nccl`` (--nccl), this interpreter's
    ``site_packages`` and ``executable``, and the facts a capture kept; ``kind``: NCCL, or
    RCCL on an AMD node."""
    finder = Finder(root, environ, search, kind)
    hint = search.get("nccl")
    if hint and (path := named_library(root, hint, kind)):
        answer = Answer("--nccl", [(path, "--nccl")] if root.exists(path) else [], False)
        return finder.library(answer, named=True), finder.read
    if hint:
        answer = finder.answer(python_at(root, hint, f"the Python at {hint} (--nccl)"))
        return finder.library(answer, named=True), finder.read
    answers = [finder.answer(python) for python in candidate_pythons(root, environ, search)] + [finder.answer(None)]
    candidates = tuple(finder.candidate(answer) for answer in answers)
    return finder.library(default_answer(answers), named=False, candidates=candidates), finder.read
