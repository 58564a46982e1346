"""One declaration per NCCL and RCCL variable (gdrprobe.nccl.params), and one home for what
each one means: no module outside gdrprobe/nccl/ reads a variable by its name (it asks a
reader of gdrprobe.nccl), and every variable name gdrprobe's code or words use is declared,
once. Also the declarations' own readings: defaults by release, as NCCL's source has them."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

from gdrprobe.nccl import params
from gdrprobe.nccl.rccl import RcclRules
from gdrprobe.nccl.versions import NcclRules

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gdrprobe"
NCCL_FOLDER = PACKAGE / "nccl"
NAME = re.compile(r"(?<![A-Za-z0-9_])(?:NCCL|RCCL)_[A-Z0-9][A-Z0-9_]*[A-Z0-9]")
KEY = re.compile(r"(?:NCCL|RCCL)_[A-Z0-9_]*")
# The parsers NCCL reads its variables with: only gdrprobe.nccl applies them.
PARSERS = {"gdrprobe.nccl.cparse"}


def python_files(folder: pathlib.Path = PACKAGE) -> list[pathlib.Path]:
    return sorted(path for path in folder.rglob("*.py") if "__pycache__" not in path.parts)


def outside_nccl() -> list[pathlib.Path]:
    return [path for path in python_files() if NCCL_FOLDER not in path.parents]


def strings(tree: ast.AST) -> list[ast.Constant]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def comments(text: str) -> list[str]:
    return [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type == tokenize.COMMENT]


def names_used(path: pathlib.Path) -> set[str]:
    """Every NCCL_/RCCL_ name in the file's strings, docstrings and comments."""
    text = path.read_text()
    found = set()
    for piece in [node.value for node in strings(ast.parse(text))] + comments(text):
        found.update(NAME.findall(piece))
    return found


def keys_used(path: pathlib.Path) -> list[str]:
    """Strings that are a variable's name (or its prefix) and nothing else: a lookup by name,
    where wording would say more than the name."""
    declared = set(params.DECLARED)
    where = path.relative_to(PACKAGE)
    return [f"{where}:{node.lineno}: {node.value!r}" for node in strings(ast.parse(path.read_text()))
            if KEY.fullmatch(node.value) or node.value in declared]


def parser_imports(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module in PARSERS:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: from {node.module}")
        if isinstance(node, ast.ImportFrom) and node.module == "gdrprobe.nccl" and \
                any(f"gdrprobe.nccl.{alias.name}" in PARSERS for alias in node.names):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: cparse")
    return found


# ---- the rule ------------------------------------------------------------------------------
def test_no_module_outside_nccl_reads_a_variable_by_its_name():
    found = [key for path in outside_nccl() for key in keys_used(path)]
    assert found == [], "read it through a declaration (gdrprobe.nccl.params) or a reader in gdrprobe.nccl"


def test_no_module_outside_nccl_parses_a_variable_itself():
    assert [found for path in outside_nccl() for found in parser_imports(path)] == []


def gdrprobe_constants() -> set[str]:
    """The module-level names gdrprobe's own code defines (RCCL_FORMATS): a docstring that
    cites one names code, not a variable."""
    found = set()
    for path in python_files():
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            found.update(target.id for target in targets if isinstance(target, ast.Name))
    return found


def test_every_variable_name_gdrprobe_uses_is_declared():
    known = set(params.DECLARED) | params.NOT_VARIABLES | gdrprobe_constants()
    undeclared = {f"{path.relative_to(PACKAGE)}: {name}" for path in python_files() for name in names_used(path)
                  if name not in known}
    assert sorted(undeclared) == [], "declare it in gdrprobe/nccl/params.py (or, a macro, in NOT_VARIABLES)"


def test_each_variable_is_declared_once_in_one_module():
    makers = {"Param", "_param", "_int", "_text"}
    declaring = {path.name for path in python_files(NCCL_FOLDER) for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in makers}
    assert declaring == {"params.py"}
    declared = [value for value in vars(params).values() if isinstance(value, params.Param)]
    assert len(declared) == len(params.DECLARED) == len({param.name for param in declared})
    assert not params.NOT_VARIABLES & set(params.DECLARED)


def test_each_declaration_names_its_source_and_its_defaults_in_release_order():
    for param in params.DECLARED.values():
        releases = [since for since, _ in param.defaults]
        assert releases == sorted(releases) and len(set(releases)) == len(releases), param.name
        assert param.source and param.kind in (params.INT, params.TEXT, params.LEVEL), param.name


# ---- the readings --------------------------------------------------------------------------
@pytest.mark.parametrize("param, version, default", [
    (params.NET_GDR_C2C, (2, 26, 2), 0), (params.NET_GDR_C2C, (2, 27, 3), 1),
    (params.CUMEM_ENABLE, (2, 18, 3), 0), (params.CUMEM_ENABLE, (2, 19, 1), -2),
    (params.PXN_C2C, (2, 27, 7), 0), (params.PXN_C2C, (2, 28, 3), 1),
    (params.IB_GID_INDEX, (2, 20, 5), 0), (params.IB_GID_INDEX, (2, 21, 5), -1),
    (params.IB_TIMEOUT, (2, 12, 12), 14), (params.IB_TIMEOUT, (2, 14, 3), 18), (params.IB_TIMEOUT, (2, 23, 4), 20),
    (params.IB_SPLIT_DATA_ON_QPS, (2, 18, 1), 1), (params.IB_SPLIT_DATA_ON_QPS, (2, 20, 3), 0),
    (params.IB_AR_THRESHOLD, (2, 30, 2), 8192), (params.IB_AR_THRESHOLD, (2, 30, 3), -2),
    (params.NET_FORCE_FLUSH, (2, 18, 3), 1), (params.NET_FORCE_FLUSH, (2, 19, 1), 0),
    (params.NVLS_ENABLE, (2, 17, 1), 1), (params.NVLS_ENABLE, (2, 18, 1), 2),
    (params.NET_GDR_LEVEL, (2, 28, 9), "PXB"), (params.NET_GDR_LEVEL, (2, 29, 2), "P2C"),
])
def test_defaults_change_at_the_release_nccls_source_changes_them(param, version, default):
    assert param.default(version) == default


def test_a_release_that_does_not_read_a_variable_reads_it_as_none():
    environ = {"NCCL_NET_GDR_C2C": "1", "NCCL_IB_DATA_DIRECT": "0"}
    assert params.NET_GDR_C2C.value(environ, NcclRules((2, 25, 1))) is None
    assert params.NET_GDR_C2C.value(environ, NcclRules((2, 26, 2))) == 1
    assert params.IB_DATA_DIRECT.value(environ, NcclRules((2, 27, 3))) == 0
    assert params.IB_DATA_DIRECT.value(environ, RcclRules()) is None       # NCCL's alone


def test_rccl_reads_nccl_s_variables_with_its_own_defaults_by_rocm_release():
    assert params.DMABUF_ENABLE.number({}, RcclRules(rocm=(6, 3, 1))) == 0
    assert params.DMABUF_ENABLE.number({}, RcclRules(rocm=(7, 12, 0))) == 1      # CHANGELOG, ROCm 7.12
    assert params.DMABUF_ENABLE.number({}, NcclRules()) == 1
    assert params.RCCL_FORCE_ENABLE_GDRDMA.value({"RCCL_FORCE_ENABLE_GDRDMA": "1"}, RcclRules()) == 1
    assert params.RCCL_FORCE_ENABLE_GDRDMA.value({"RCCL_FORCE_ENABLE_GDRDMA": "1"}, NcclRules()) is None


@pytest.mark.parametrize("text, value", [("0x10", 16), ("010", 8), ("08", 0), ("yes", 0), ("", 1),
                                         ("99999999999999999999", 1), (" 2", 2)])
def test_integers_are_read_as_ncclloadparam_reads_them(text, value):
    """src/misc/param.cc ncclLoadParam: strtoll(str, NULL, 0); empty or ERANGE: the default."""
    assert params.DMABUF_ENABLE.number({"NCCL_DMABUF_ENABLE": text}) == value


def test_what_ifs_drop_variables_by_declaration_or_name():
    environ = {"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "INFO", "PATH": "/bin"}
    assert params.without(environ, params.IB_HCA, "NCCL_DEBUG") == {"PATH": "/bin"}
    assert params.library_variables({**environ, "RCCL_X": "1"}) == ["NCCL_DEBUG", "NCCL_IB_HCA", "RCCL_X"]
