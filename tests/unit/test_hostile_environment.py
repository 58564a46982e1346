"""The gate on a fixture machine whose job's environment is hostile (issue 43 items 3 and 6):
a number of 4,301 or more digits in a variable the gate reads was Python's ValueError and
exit 70 ("a bug in gdrprobe", never a drain but never a check either); a 100 KB value was
echoed whole, twice; U+2028 and U+FFFE reached the line a prolog turns into the drain
reason. Every variable gdrprobe reads is tried: the launchers' ranks, the job's GPUs, and
each NCCL variable named in gdrprobe's source. The run engine is the `runs` recorder."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from gdrprobe.campaign import gate, job_gpus, machine
from gdrprobe.cli import main
from tests.unit.doctor import nccl_machines

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gdrprobe"
GATE_VARIABLES = (*gate.RANK_VARIABLES, *job_gpus.SOURCES[1:])
NCCL_VARIABLES = sorted({name for path in PACKAGE.rglob("*.py")
                         for name in re.findall(r'"(NCCL_[A-Z0-9_]+)"', path.read_text())})
HUGE_NUMBER = "9" * 5000
LONG_TEXT = "x" * 100_000
HIDDEN = "0\u2028drain reason\ufffe\x1b[31m"
MESSAGE_BYTES = 4096          # what a prolog keeps of a check's words is far less


@pytest.fixture
def node(tmp_path, monkeypatch, runs, locks):
    """A two-pair node every check reads instead of this machine, in this process's
    environment; the NIC locks in scratch."""
    nccl_machines.pix_pairs(tmp_path, pairs=2)
    real = machine.machine_facts
    monkeypatch.setattr(machine, "machine_facts", lambda root="/", environ=None, job=None:
                        real(str(tmp_path), dict(os.environ), job))
    for name, value in locks.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def gate_says(argv, monkeypatch, capsys, variables: dict[str, str]) -> tuple[int, str]:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("argv", [["check", "--quiet"], ["check", "--node", "--quiet"]], ids=" ".join)
@pytest.mark.parametrize("value", [HUGE_NUMBER, LONG_TEXT, HIDDEN], ids=["digits", "100KB", "hidden"])
@pytest.mark.parametrize("name", GATE_VARIABLES)
def test_a_gate_variable_never_makes_a_bug_nor_a_flood(node, monkeypatch, capsys, argv, name, value):
    code, said = gate_says(argv, monkeypatch, capsys, {name: value})
    assert code != 70, said
    assert len(said) < MESSAGE_BYTES, said[:300]
    assert "\u2028" not in said and "\ufffe" not in said and "\x1b" not in said


@pytest.mark.parametrize("argv", [["check", "--quiet"], ["check", "--node", "--quiet"]], ids=" ".join)
@pytest.mark.parametrize("value", [HUGE_NUMBER, "-" + HUGE_NUMBER, "0x" + "f" * 5000, HIDDEN],
                         ids=["digits", "negative", "hex", "hidden"])
def test_every_nccl_variable_at_once_never_makes_a_bug(node, monkeypatch, capsys, argv, value):
    assert len(NCCL_VARIABLES) > 20
    code, said = gate_says(argv, monkeypatch, capsys, dict.fromkeys(NCCL_VARIABLES, value))
    assert code != 70, said
    assert "\u2028" not in said and "\ufffe" not in said


@pytest.mark.parametrize("gpu", [HUGE_NUMBER, "\uff10", "\u00b2", LONG_TEXT])
def test_check_gpu_of_any_length_is_a_usage_error(node, capsys, gpu):
    assert main(["check", "--gpu", gpu, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is neither a GPU ordinal nor a PCI bus id" in err and len(err) < MESSAGE_BYTES


# ---- numbers on the command line (issue 43 item 6) -----------------------------------------


@pytest.mark.parametrize("argv", [
    ["run", "--loopback", "--connect-wait", "1_000"],
    ["run", "--loopback", "--connect-wait", "\uff11\uff10"],          # fullwidth 10
    ["run", "--loopback", "-n", "1_000"],
    ["run", "--loopback", "-n", "\uff11\uff10"],
    ["run", "--loopback", "-n", " 5"],
    ["check", "--threshold", "nan"],
    ["check", "--time-budget", "inf"],
    ["check", "--repeats", "\u0663"],                                 # an Arabic-Indic 3
    ["check", "-q", "1_0"],
    ["bench", "--qp", "1,\uff12"],
    ["bench", "--max-drop", "0x10"],
    ["serve", "--port", "1_000"],
    ["check", "--size", "1_000K"],
], ids=" ".join)
def test_what_is_no_number_as_c_or_a_person_writes_it_is_a_usage_error(argv, capsys, monkeypatch):
    import gdrprobe

    for name in ("run", "check", "check_node", "bench", "serve"):
        monkeypatch.setattr(gdrprobe, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran"))
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert "is not a" in capsys.readouterr().err


@pytest.mark.parametrize("text, value", [("4", 4), ("-1", -1), ("+3", 3), ("0.5", 0.5),
                                         ("1e-3", 1e-3), (HUGE_NUMBER, (1 << 63) - 1)])
def test_what_a_person_writes_is_still_taken(text, value):
    from gdrprobe.cli.common import real_number, whole

    assert (real_number if isinstance(value, float) else whole)(text) == value
