"""What an operator installs (issue 41 item 5): the advice for a missing extra works where it
is printed (this interpreter's own pip, or the distribution's package), and docs/install.md
lists every extra with its version rule as pyproject.toml declares it."""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from gdrprobe.errors import EXTRAS, MissingDependency, extra_fix, pip_install

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEVELOPERS_EXTRAS = {"test", "lab"}


def declared_extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["optional-dependencies"]


def test_every_users_extra_has_its_advice_and_no_other():
    assert set(EXTRAS) == set(declared_extras()) - DEVELOPERS_EXTRAS
    for extra, requirements in declared_extras().items():
        if extra in EXTRAS:
            names = {re.split(r"[<>=!~;\[ ]", requirement)[0] for requirement in requirements}
            assert EXTRAS[extra][0] in names


def test_the_advice_names_this_interpreters_pip_and_the_distributions_package():
    fix = extra_fix("prometheus")
    assert fix.startswith(f"{shlex.quote(sys.executable)} -m pip install 'gdrprobe[prometheus]'")
    assert "apt-get install python3-prometheus-client" in fix
    assert "apt-get" not in extra_fix("nvml")          # Debian 12 has no python3-pynvml


def test_the_pip_command_printed_is_one_a_shell_runs_as_written():
    """A venv's interpreter path, even with a space, is one word; the requirement's
    brackets are quoted (an unquoted [..] is a glob in a shell)."""
    words = shlex.split(pip_install("gdrprobe[plot]"))
    assert words == [sys.executable, "-m", "pip", "install", "gdrprobe[plot]"]


def test_a_missing_extra_at_the_command_line_prints_the_interpreters_own_pip(tmp_path):
    """Without prometheus_client, bench --prometheus refuses before measuring, with a fix
    that works from where gdrprobe runs (an import blocked, as a missing extra)."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['prometheus_client'] = None\n")
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "bench", "--prometheus",
                           str(tmp_path / "out.prom")], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": f"{tmp_path}:{ROOT}",
                                           "PATH": "/usr/bin:/bin"})
    assert done.returncode == MissingDependency.exit_code, done.stderr
    assert f"{sys.executable} -m pip install 'gdrprobe[prometheus]'" in done.stderr


def test_install_md_lists_every_extra_with_its_version_rule():
    page = (ROOT / "docs" / "install.md").read_text()
    for extra, requirements in declared_extras().items():
        if extra in DEVELOPERS_EXTRAS:
            continue
        row = next((line for line in page.splitlines()
                    if line.startswith("|") and f"gdrprobe[{extra}]" in line), "")
        assert row, f"docs/install.md has no row for the extra {extra}"
        for requirement in requirements:
            assert f"`{requirement}`" in row, (extra, requirement)
