"""The native layer builds without a warning, and none is silenced: the C in csrc/ and the
C that Cython makes of _native.pyx, compiled with setup.py's warning flags plus -Werror
(the build itself has no -Werror: a user's newer compiler must not fail pip)."""

import ast
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def setup_assignment(name: str):
    """The literal value setup.py assigns to name (setup.py itself cannot be imported: it
    builds)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"setup.py assigns no {name}")


def compiler() -> list[str]:
    command = shlex.split(sysconfig.get_config_var("CC") or "cc")
    if not shutil.which(command[0]):
        pytest.skip(f"no C compiler {command[0]}")
    return command


def compile_with_werror(source: pathlib.Path, *extra: str) -> None:
    flags = [*shlex.split(sysconfig.get_config_var("CFLAGS") or ""), *setup_assignment("WARNINGS"),
             "-Werror", f"-I{ROOT / 'csrc'}", f"-I{sysconfig.get_paths()['include']}"]
    run = subprocess.run([*compiler(), *flags, *extra, str(source)], capture_output=True,
                         text=True, timeout=100)
    assert run.returncode == 0, run.stderr


def test_setup_asks_for_all_warnings_and_silences_none():
    warnings = setup_assignment("WARNINGS")
    assert {"-Wall", "-Wextra"} <= set(warnings)
    assert not [flag for flag in warnings if flag.startswith("-Wno-")]
    assert "-Wno-" not in (ROOT / "setup.py").read_text()


@pytest.mark.parametrize("source", setup_assignment("CSRC"))
def test_the_c_compiles_without_a_warning(source, tmp_path):
    compile_with_werror(ROOT / source, "-c", "-fPIC", "-o", str(tmp_path / "out.o"))


def test_cythons_output_compiles_without_a_warning(tmp_path):
    """The warnings Cython's output has drawn (sign-compare, unused functions) come from
    the compiler's front end, which -fsyntax-only runs in a second instead of ten."""
    pytest.importorskip("Cython")
    output = tmp_path / "_native.c"
    cython = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", str(ROOT),
                             str(ROOT / "gdrprobe" / "_native.pyx"), "-o", str(output)],
                            capture_output=True, text=True, timeout=100)
    assert cython.returncode == 0 and "warning" not in cython.stderr.lower(), cython.stderr
    compile_with_werror(output, "-fsyntax-only")
