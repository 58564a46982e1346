"""The package's layering, checked: imports point down, modules stay readable, and the doctor
runs on a machine where the native extension is not built (a capture replayed on a laptop).

One table says what each layer may import (docs/ARCHITECTURE.md, "The layers"):

    C loop -> _native -> rdma -> memory, protocol -> measure, doctor -> campaign
           -> the public API (gdrprobe/__init__.py) -> cli

report/ (models and renderers) sits beside the base modules: every layer may use it, and it
uses none of them. nccl/ (NCCL's rules: its variables, one declaration each, and what NCCL
does with them) is pure and uses only the base and report/, so every layer from rdma/ up may
ask it: the GID NCCL picks, the registration NCCL makes, each has one home there.

Importing the bare package ``gdrprobe`` (or ``from gdrprobe import X`` where X is no submodule)
is importing the public API, which only the command line may do.
"""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap
from dataclasses import dataclass

import pytest

from tests.unit.doctor import machines
from tests.unit.fakes.processes import run_without_native

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gdrprobe"

# ---- the table ---------------------------------------------------------------------------
API = "gdrprobe"        # the bare package: matched exactly, never as a prefix of everything
BASE = ("gdrprobe.errors", "gdrprobe.sysroot", "gdrprobe.defaults", "gdrprobe.numbers",
        "gdrprobe.files")
REPORT = BASE
NCCL = BASE + ("gdrprobe.report",)
RDMA = NCCL + ("gdrprobe.nccl", "gdrprobe._native", "gdrprobe._nccl")
PROTOCOL = RDMA + ("gdrprobe.rdma",)
# memory borrows protocol's pure field validators, not its channel or messages
MEMORY = RDMA + ("gdrprobe.rdma", "gdrprobe.protocol.fields")
MEASURE = RDMA + ("gdrprobe.rdma", "gdrprobe.memory", "gdrprobe.protocol")
DOCTOR = NCCL + ("gdrprobe.nccl",)
CAMPAIGN = MEASURE + ("gdrprobe.measure", "gdrprobe.doctor")
PUBLIC = CAMPAIGN + ("gdrprobe.campaign",)
# The command line parses, calls the public API and renders; nothing below the API.
CLI = (API, "gdrprobe.errors", "gdrprobe.defaults", "gdrprobe.numbers", "gdrprobe.files",
       "gdrprobe.report")


@dataclass(frozen=True)
class Rule:
    may_import: tuple[str, ...]
    # Allowed inside a function only: the doctor asks verbs and the CUDA driver for facts
    # when it runs, so `import gdrprobe.doctor` stays light and replays without them.
    lazily: tuple[str, ...] = ()


# Every layer, by the module its files live under; each may also import itself.
RULES = {
    "gdrprobe.errors": Rule(BASE),
    "gdrprobe.sysroot": Rule(BASE),
    "gdrprobe.defaults": Rule(BASE),
    "gdrprobe.numbers": Rule(BASE),
    "gdrprobe.files": Rule(BASE),
    "gdrprobe.report": Rule(REPORT),
    "gdrprobe.rdma": Rule(RDMA),
    "gdrprobe.protocol": Rule(PROTOCOL),
    "gdrprobe.memory": Rule(MEMORY),
    "gdrprobe.measure": Rule(MEASURE),
    "gdrprobe.nccl": Rule(NCCL),
    "gdrprobe.doctor": Rule(DOCTOR, lazily=("gdrprobe.rdma", "gdrprobe.memory")),
    "gdrprobe.campaign": Rule(CAMPAIGN),
    API: Rule(PUBLIC),
    "gdrprobe.cli": Rule(CLI),
    "gdrprobe.__main__": Rule(("gdrprobe.cli",)),
}

MAX_LINES = 600

# Modules that import each other (at the top, inside a function or by name): each group is
# closed by an import that cannot be at the top, where a shared type lives above one of its
# users. None may be added; these wait to be opened by moving what they share down.
KNOWN_CYCLES = {
    # memory/runtime.py's registry imports each runtime by name; each builds its record from
    # runtime.GpuRuntime
    ("gdrprobe.memory.cuda", "gdrprobe.memory.rocm", "gdrprobe.memory.runtime"),
    # the bench's pairs in report/model.py name report/check.py's Verdict and the run's NCCL
    # pattern rows report/nccl_pattern.py's results (types only)
    ("gdrprobe.report.check", "gdrprobe.report.model", "gdrprobe.report.nccl_pattern"),
    # the doctor's runtime collectors: doctor/facts/runtimes.py finds each by name, the
    # context holds them, and each names DoctorContext for its types; topology asks them
    ("gdrprobe.doctor.facts.context", "gdrprobe.doctor.facts.cuda",
     "gdrprobe.doctor.facts.nccl_node", "gdrprobe.doctor.facts.runtimes",
     "gdrprobe.doctor.facts.topology"),
}


# ---- the checker -------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    name: str        # the module it loads: "gdrprobe" for the public API
    line: int
    lazy: bool       # inside a function: runs when called, not when imported


def module_name(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> str:
    """gdrprobe/doctor/nccl/rules.py -> gdrprobe.doctor; gdrprobe/__init__.py -> gdrprobe."""
    parts = module_name(path, package).split(".")
    return ".".join(parts[:2])


def is_submodule(name: str, package: pathlib.Path) -> bool:
    """Whether a dotted gdrprobe name is a module or package on disk (not an attribute)."""
    where = package.parent.joinpath(*name.split("."))
    return (where.is_dir() or where.with_suffix(".py").is_file()
            or where.with_suffix(".pyx").is_file())


def resolve_from(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The module named by `from <...> import`, relative ones included."""
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def from_targets(node: ast.ImportFrom, here: str, is_package: bool,
                 package: pathlib.Path) -> list[str]:
    """`from gdrprobe import _native` loads a submodule; `from gdrprobe import check` loads
    the package itself: the public API."""
    source = resolve_from(node, here, is_package)
    targets = []
    for alias in node.names:
        candidate = f"{source}.{alias.name}"
        targets.append(candidate if alias.name != "*" and is_submodule(candidate, package)
                       else source)
    return list(dict.fromkeys(targets))     # once per statement: `import a, b` of one module


def imports_of(path: pathlib.Path, package: pathlib.Path = PACKAGE, top: str = API) -> list[Import]:
    """Every module of the top package (gdrprobe; lab) a file imports, at the top or inside
    a function, by statement or by name in a string (importlib.import_module over a list)."""
    here, is_package = module_name(path, package), path.name == "__init__.py"
    by_name = re.compile(rf"{top}(\.\w+)+")
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.extend(Import(name, node.lineno, lazy)
                         for name in from_targets(node, here, is_package, package))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and by_name.fullmatch(node.value)):
            found.append(Import(node.value, node.lineno, lazy=True))
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text()), lazy=False)
    return [found_import for found_import in found
            if found_import.name == top or found_import.name.startswith(top + ".")]


def within(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == prefix or (prefix != API and name.startswith(prefix + "."))
               for prefix in allowed)


def violations(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> list[str]:
    """What a file imports that its layer may not, as 'line: name (why)'."""
    layer = layer_of(path, package)
    rule = RULES[layer]
    found = []
    for imported in imports_of(path, package):
        if within(imported.name, rule.may_import + (layer,)):
            continue
        if imported.lazy and within(imported.name, rule.lazily):
            continue
        why = ("the public API" if imported.name == API
               else "only inside a function" if within(imported.name, rule.lazily)
               else "a layer it may not use")
        found.append(f"{imported.line}: {imported.name} ({why})")
    return found


def python_files(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path for path in folder.rglob("*.py") if "__pycache__" not in path.parts)


def files_of(layer: str) -> list[pathlib.Path]:
    return [path for path in python_files(PACKAGE) if layer_of(path) == layer]


# ---- the package obeys the table ----------------------------------------------------------
def test_every_module_of_the_package_has_a_layer():
    unruled = sorted({layer_of(path) for path in python_files(PACKAGE)} - set(RULES))
    assert unruled == [], "add these to RULES, between the layers they sit between"


@pytest.mark.parametrize("layer", sorted(RULES))
def test_each_layer_imports_only_what_lies_below_it(layer):
    offenders = {str(path.relative_to(PACKAGE)): violations(path) for path in files_of(layer)}
    assert {path: found for path, found in offenders.items() if found} == {}


def test_the_verdict_and_the_report_model_are_pure():
    heavy = ("gdrprobe._native", "gdrprobe.rdma", "gdrprobe.memory.cuda", "pyverbs", "cuda")
    for path in (PACKAGE / "campaign" / "verdict.py", PACKAGE / "report" / "model.py",
                 PACKAGE / "memory" / "spec.py", PACKAGE / "memory" / "causes.py"):
        assert reaching(path, heavy) == [], path


def test_options_open_no_device_and_no_memory():
    assert reaching(PACKAGE / "measure" / "options.py",
                    ("gdrprobe.memory.buffers", "gdrprobe.memory.gpu", "gdrprobe.memory.host",
                     "gdrprobe.memory.cuda", "gdrprobe.protocol.channel")) == []


def reaching(path: pathlib.Path, forbidden: tuple[str, ...]) -> list[str]:
    """Which of the forbidden modules (gdrprobe's or third-party) a file imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted(name for name in names if within(name, forbidden))


def test_every_folder_of_the_package_ships():
    """pyproject.toml finds the packages by their __init__.py: a folder of modules without
    one would be left out of the wheel, and work only from a checkout."""
    folders = {path.parent for path in python_files(PACKAGE)}
    assert sorted(str(folder.relative_to(ROOT)) for folder in folders
                  if not (folder / "__init__.py").is_file()) == []


@pytest.mark.parametrize("folder", ["gdrprobe", "lab", "benchmarks"])
def test_no_module_is_over_600_lines(folder):
    sources = python_files(ROOT / folder) + sorted((ROOT / folder).rglob("*.pyx"))
    too_long = {str(path.relative_to(ROOT)): lines for path in sources
                if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert too_long == {}, f"split these below {MAX_LINES} lines"


def import_cycles(package: pathlib.Path) -> set[tuple[str, ...]]:
    """The groups of modules of a package that import each other (the strongly connected
    components of its import graph, Tarjan's), each as its sorted names."""
    sources = python_files(package) + sorted(package.rglob("*.pyx"))
    modules = {module_name(path, package): path for path in sources}

    def owner(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name

    graph = {name: {owner(found.name) for found in imports_of(path, package, package.name)}
             - {name} if path.suffix == ".py" else set() for name, path in modules.items()}
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    groups = set()

    def visit(name: str) -> None:
        index[name] = lowest[name] = len(index)
        stack.append(name)
        for imported in graph[name] & set(modules):
            if imported not in index:
                visit(imported)
                lowest[name] = min(lowest[name], lowest[imported])
            elif imported in stack:
                lowest[name] = min(lowest[name], index[imported])
        if lowest[name] == index[name]:
            group = [stack.pop()]
            while group[-1] != name:
                group.append(stack.pop())
            if len(group) > 1:
                groups.add(tuple(sorted(group)))

    for name in sorted(modules):
        if name not in index:
            visit(name)
    return groups


@pytest.mark.parametrize("folder", ["gdrprobe", "lab"])
def test_no_two_modules_import_each_other_beyond_the_known(folder):
    """campaign/bench with campaign/bench_rails, lab/modules with lab/dmabuf_rows and cli/
    with cli/common were closed by imports inside a function; what they share moved down
    (campaign/bench_plan.py, lab/dmabuf_guest.py, cli/signals.py)."""
    assert import_cycles(ROOT / folder) - KNOWN_CYCLES == set()


def test_the_known_cycles_are_still_there():
    """A known cycle that is gone comes off the list."""
    assert KNOWN_CYCLES <= import_cycles(PACKAGE)


def test_the_map_names_every_module():
    """docs/ARCHITECTURE.md's map lagged eight new modules: every module of the package and
    every file of the C loop is named there (in a code span, by its name or its path)."""
    spans = re.findall(r"`([^`\n]+)`", (ROOT / "docs" / "ARCHITECTURE.md").read_text())
    named = {pathlib.PurePath(span).stem for span in spans} | set(spans)
    sources = (python_files(PACKAGE) + sorted(PACKAGE.rglob("*.pyx"))
               + sorted((ROOT / "csrc").glob("*.c")))
    unnamed = [str(path.relative_to(ROOT)) for path in sources
               if path.name != "__init__.py" and path.stem not in named]
    assert unnamed == [], "add them to docs/ARCHITECTURE.md's table of the layers"


# ---- the checker catches what it should ---------------------------------------------------
def synthetic_package(tmp_path: pathlib.Path, relative: str, source: str) -> pathlib.Path:
    """A throwaway gdrprobe/ with one file, plus the submodules the imports name."""
    package = tmp_path / "gdrprobe"
    for sub in ("rdma", "doctor", "memory", "report", "nccl"):
        (package / sub).mkdir(parents=True, exist_ok=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("")
    (package / "_native.pyx").write_text("")
    (package / "rdma" / "verbs.py").write_text("")
    path = package / relative
    path.write_text(textwrap.dedent(source))
    return path


def synthetic_violations(tmp_path: pathlib.Path, relative: str, source: str) -> list[str]:
    path = synthetic_package(tmp_path, relative, source)
    return violations(path, tmp_path / "gdrprobe")


def test_a_lower_layer_importing_the_public_api_is_caught(tmp_path):
    found = synthetic_violations(tmp_path, "rdma/verbs.py", "from gdrprobe import check\n")
    assert found == ["1: gdrprobe (the public API)"]


@pytest.mark.parametrize("source", [
    "import gdrprobe\n",
    "from .. import check\n",
    "def later():\n    from gdrprobe import check\n",
])
def test_every_way_of_reaching_the_public_api_is_caught(tmp_path, source):
    found = synthetic_violations(tmp_path, "rdma/verbs.py", source)
    assert len(found) == 1 and "gdrprobe (the public API)" in found[0]


def test_a_submodule_of_the_package_is_not_the_public_api(tmp_path):
    source = "from gdrprobe import _native, errors\nfrom . import verbs\n"
    assert synthetic_violations(tmp_path, "rdma/handles.py", source) == []


def test_an_import_by_name_is_caught(tmp_path):
    source = "import importlib\nMODULES = ('gdrprobe.measure.session',)\n"
    found = synthetic_violations(tmp_path, "rdma/verbs.py", source)
    assert found == ["2: gdrprobe.measure.session (a layer it may not use)"]


def test_the_doctor_asks_verbs_only_inside_a_function(tmp_path):
    top = synthetic_violations(tmp_path, "doctor/facts.py", "from gdrprobe.rdma import verbs\n")
    lazy = synthetic_violations(tmp_path, "doctor/facts.py",
                                "def facts():\n    from gdrprobe.rdma import verbs\n")
    assert top == ["1: gdrprobe.rdma.verbs (only inside a function)"] and lazy == []


def test_a_doctor_subfolder_is_still_the_doctor(tmp_path):
    (tmp_path / "gdrprobe" / "doctor" / "checks").mkdir(parents=True)
    found = synthetic_violations(tmp_path, "doctor/checks/acs.py",
                                 "from gdrprobe.measure import loops\n")
    assert found == ["1: gdrprobe.measure (a layer it may not use)"]


# ---- the doctor without the native extension ---------------------------------------------


def test_doctor_and_capture_replay_without_the_native_extension(tmp_path):
    machines.acs_node(tmp_path, pairs=1)
    done = run_without_native(
        "import sys, gdrprobe.doctor.runner, gdrprobe.doctor.capture\n"
        "from gdrprobe.cli import main\n"
        f"code = main(['doctor', '--root', {str(tmp_path)!r}])\n"
        "assert 'gdrprobe._native' not in sys.modules\n"
        "sys.exit(code)\n")
    assert done.returncode == 1, done.stderr        # the ACS finding fails, as it should
    assert "First blocker: acs.bridge" in done.stdout
    assert "Traceback" not in done.stderr
