"""Flags that agree across commands, and help texts that say what a newcomer needs: every
option with a default shows it, every valid range comes from where it is defined, and every
subcommand's help ends with an example."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

import gdrprobe
from gdrprobe.cli import build_parser
from gdrprobe.cli.common import size, size_list

# Options that take no value: present or absent, nothing to default.
FLAG_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction,
                argparse._VersionAction, argparse._StoreConstAction)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (actions,) = [a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction)]
    return dict(actions.choices)


def help_text(command: str) -> str:
    """What `gdrprobe COMMAND --help` prints, its lines joined (argparse wraps them)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return " ".join(out.getvalue().split())


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_option_with_a_default_shows_it(command):
    """Each option that takes a value and has a default says so in `gdrprobe COMMAND
    --help` (as "default 30", "(default: /)", "every pair (default)"...)."""
    text = help_text(command)
    silent = []
    for action in subcommands()[command]._actions:
        if isinstance(action, FLAG_ACTIONS) or not action.option_strings:
            continue
        if action.default in (None, ()):
            continue                # optional: absent means not done (an output, a filter)
        expanded = " ".join((action.help % vars(action)).split())
        if "default" not in expanded:
            silent.append(f"{'/'.join(action.option_strings)} (default {action.default!r})")
        assert expanded in text, "the help printed is the help checked"
    assert silent == []


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_subcommand_help_ends_with_an_example(command):
    parser = subcommands()[command]
    assert parser.epilog and re.search(rf"^example: .*gdrprobe {command}\b", parser.epilog)
    assert "example: " in help_text(command)


def test_the_ranges_in_the_help_are_the_engine_s():
    from gdrprobe.measure import options

    run, bench = help_text("run"), help_text("bench")
    low, high = options.MIN_TIMEOUT_S, options.MAX_TIMEOUT_S
    for text in (run, bench, help_text("serve"), help_text("cluster")):
        assert f"time-out of every out-of-band step, {low:g} to {high:g} s" in text
    assert f"number of QPs, 1 to {options.MAX_QPS} (bandwidth; default 1)" in run
    assert f"QP counts, e.g. 1,4, each 1 to {options.MAX_QPS} (default 1)" in bench
    assert gdrprobe.limits() == {"timeout_s": (low, high), "qps": (1, options.MAX_QPS)}


def test_building_the_parser_reads_no_range(monkeypatch):
    """The ranges come from the native extension: read when a help is printed, not when a
    command that needs none (doctor, capture) builds its parser."""
    calls = []
    real = gdrprobe.limits
    monkeypatch.setattr(gdrprobe, "limits", lambda: calls.append(1) or real())
    build_parser().parse_args(["doctor"])
    assert calls == []
    help_text("run")
    assert calls


# ---- flags that agree ---------------------------------------------------------------------


def test_one_size_parser_for_every_command():
    assert size("64K") == size("64k") == 65536 and size("1M") == 1 << 20 and size("4096") == 4096
    assert size_list("4K,64K,1M") == (4096, 65536, 1 << 20)
    parser = build_parser()
    assert parser.parse_args(["run", "--loopback", "-s", "64K"]).size == 65536
    assert parser.parse_args(["bench", "--sizes", "64K"]).sizes == (65536,)
    assert parser.parse_args(["cluster", "-s", "1M"]).size == 1 << 20
    assert parser.parse_args(["check", "-s", "1M"]).size == 1 << 20


@pytest.mark.parametrize("text", ["0", "64X", "-1", "K", "1.5M", ""])
def test_a_bad_size_is_refused_with_an_example(text, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--loopback", "-s", text])
    assert "is not a size such as 4096, 64K or 1M" in capsys.readouterr().err


def test_devices_takes_ib_dev_like_every_other_command_and_keeps_device():
    parser = build_parser()
    for flag in ("-d", "--ib-dev", "--device"):
        assert parser.parse_args(["devices", flag, "mlx5_0"]).device == "mlx5_0"
    assert "--device is the former spelling" in help_text("devices")
    for command in ("run", "serve", "bench", "cluster", "check"):
        assert "--ib-dev" in subcommands()[command]._option_string_actions, command


def test_cluster_writes_its_document_with_o_as_bench_does():
    assert build_parser().parse_args(["cluster", "-o", "m.json"]).output == "m.json"
    assert build_parser().parse_args(["bench", "-o", "m.json"]).output == "m.json"


def test_the_help_prints_where_the_native_extension_was_never_built():
    from tests.unit.fakes.processes import run_without_native

    done = run_without_native("from gdrprobe.cli import main\nmain(['run', '--help'])\n")
    assert done.returncode == 0, done.stderr
    assert "a range the native extension sets (not built here)" in " ".join(done.stdout.split())


# ---- perftest's habits get gdrprobe's equivalent (issue 29) ----------------------------------


@pytest.mark.parametrize("argv, equivalent", [
    (["check", "--report_gbits"], "--report-gbits"),
    (["bench", "--report_gbits"], "report Gb/s always"),
    (["check", "--use_cuda", "0"], "--gpu N"),
    (["run", "--loopback", "--use_cuda=0"], "--mem gpu --gpu N"),
    (["check", "--use_cuda_dmabuf"], "--mem dmabuf"),
    (["check", "-F"], "--clock"),
    (["check", "-b"], "names a failing direction"),
    (["check", "-b"], "on run, bench and cluster"),
    (["check", "-a"], "gdrprobe bench"),
    (["bench", "-a"], "--sizes LIST"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else "")
def test_a_perftest_spelling_is_refused_with_gdrprobes_equivalent(argv, equivalent, capsys):
    """argparse answered with the top level's usage and 'unrecognized arguments'; now the
    command's own usage and what gdrprobe calls it (cli/perftest.py's one table)."""
    from gdrprobe.cli import main
    from gdrprobe.cli.perftest import PERFTEST_SPELLINGS

    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert err.startswith(f"usage: gdrprobe {argv[0]} ")
    spelling = next(a.split("=")[0] for a in argv if a.split("=")[0] in PERFTEST_SPELLINGS)
    assert f"{spelling} is perftest's spelling: " in err and equivalent in err


def test_the_perftest_table_names_no_flag_a_command_takes_as_perftest_does():
    """A spelling in the table is one a command would refuse; the flags gdrprobe shares with
    perftest (run -a) still mean what they mean there."""
    from gdrprobe.cli.perftest import PERFTEST_SPELLINGS

    commands = subcommands()
    assert build_parser().parse_args(["run", "--loopback", "-a"]).all is True
    assert build_parser().parse_args(["bench", "-b"]).bidir is True
    shared = {"-b": {"run", "bench", "cluster"}}     # perftest's -b, meant as perftest does
    for spelling in PERFTEST_SPELLINGS:
        takers = [name for name, parser in commands.items()
                  if spelling in parser._option_string_actions]
        assert set(takers) <= shared.get(spelling, {"run"}), (spelling, takers)


def test_an_unknown_flag_is_refused_with_the_command_s_usage(capsys):
    from gdrprobe.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["devices", "--bogus"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.startswith("usage: gdrprobe devices ")
    assert "unrecognized arguments: --bogus" in err and "perftest" not in err
