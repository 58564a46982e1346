"""--mem's default is each command's own, and its help says which (cluster: gpu; run and
serve: host), from the one add_memory_flags."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from gdrprobe.cli import build_parser


def subcommand(name: str) -> argparse.ArgumentParser:
    (actions,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return actions.choices[name]


@pytest.mark.parametrize("command, argv, default", [
    ("cluster", ["cluster"], "gpu"), ("run", ["run", "--loopback"], "host"),
    ("serve", ["serve"], "host")])
def test_mem_default_is_the_one_the_help_states(command, argv, default):
    assert build_parser().parse_args(argv).mem == default
    (mem,) = [a for a in subcommand(command)._actions if "--mem" in a.option_strings]
    assert mem.default == default and mem.help.endswith(f"(default {default})")
    # What `gdrprobe COMMAND --help` prints (argparse wraps the help: join its lines).
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = re.sub(r"\s+", " ", out.getvalue())
    assert f"staged through host memory (default {default})" in text
