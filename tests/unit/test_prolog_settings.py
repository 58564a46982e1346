"""The prolog's settings file is read as data, never run (issue 41 item 3): each settings
error is a log record naming its line, the metric, and the strict rule, never a shell
syntax error on a stderr nobody reads; durations as timeout(1) and Slurm write them; only
argparse's error line reaches a log or a reason; the health check found from anywhere."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.unit.fakes.prolog import HEALTH_CHECK, NODE, PROLOG, executable, read

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")

# Each one a settings error, with what the log record names.
BROKEN = [
    ('GDRPROBE_CHECK_ARGS="--time-budget 6', "line 3: a double quote left open"),
    ("GDRPROBE_CHECK_ARGS='--time-budget 6", "line 3: a single quote left open"),
    ("GDRPROBE=$(touch {ran})", "line 3: $(...) would run a command"),
    ("GDRPROBE=`id`", '"`" is shell syntax'),
    ("GDRPROBE_PROLOG_STRICT=0; rm -rf /", '";" is shell syntax'),
    ("GDRPROBE_PROLOG_TIMEOUT=8 seconds", "line 3: one setting a line"),
    ("GDRPROBE_PROLOG_STRCT=1", "line 3: GDRPROBE_PROLOG_STRCT is not a setting of the prolog"),
    ("NCCL_IB_HCA=mlx5_0", "(a variable for gdrprobe is exported: export NCCL_IB_HCA=...)"),
    ("GDRPROBE_PROLOG_TIMEOUT=eight", "line 3: GDRPROBE_PROLOG_TIMEOUT=eight is not a duration"),
    ("GDRPROBE_PROLOG_KILL_AFTER=0", "line 3: GDRPROBE_PROLOG_KILL_AFTER=0 is not a duration"),
    ("GDRPROBE_JOB_WITHOUT_GPUS=sometimes", "line 3: GDRPROBE_JOB_WITHOUT_GPUS=sometimes is not one of"),
    ("GDRPROBE_PROLOG_STRICT=yes", "line 3: GDRPROBE_PROLOG_STRICT=yes is not one of: 0 1"),
    ("X=${HOME:-/root}", "line 3: only $NAME and ${NAME} are expanded"),
    ("GDRPROBE=", "line 3: GDRPROBE is empty"),
    ("GDRPROBE=/opt/gdrprobe/bin/gdrprobe\\", "line 3: a backslash at the end of the line"),
    ("just some words", "line 3: not a setting (NAME=VALUE)"),
]


@pytest.mark.parametrize("line, named", BROKEN, ids=[line for line, _ in BROKEN])
def test_a_settings_error_is_logged_with_its_line_and_nothing_runs(node, line, named):
    node.settings(line.replace("{ran}", str(node.dir / "ran")))
    done = node(1)                          # the check would drain: it must not run
    assert done.returncode == 0 and done.stderr == ""
    assert node.checked() == [] and node.drained() == []
    assert not (node.dir / "ran").exists()
    [record] = node.log().splitlines()
    assert (f"node {NODE}, job 42: gdrprobe cannot check (a settings error, nothing checked), "
            f"the job starts (GDRPROBE_PROLOG_STRICT=1 drains): {node.conf}: ") in record
    assert named in record
    assert node.metrics() | {"gdrprobe_prolog_timestamp_seconds": "-"} == {
        "gdrprobe_prolog_exit_code": "2", "gdrprobe_prolog_cannot_check": "1",
        "gdrprobe_prolog_timestamp_seconds": "-"}


def test_in_strict_mode_a_settings_error_drains_and_turns_the_job_away(node):
    """The issue's case: an unbalanced quote, which made the sourced file a shell syntax
    error (exit 2, "Prolog error", every node, no record), is read past: strict mode from
    the lines that are whole."""
    node.settings("GDRPROBE_PROLOG_STRICT=1", 'GDRPROBE_CHECK_ARGS="--time-budget 6')
    done = node(0)
    assert done.returncode == 1 and node.checked() == []
    assert node.reason().startswith(
        f"gdrprobe cannot check: settings: {node.conf}: line 4: a double quote left open")
    assert node.requeued() == ["requeuehold 42"]
    assert "drain, the job is requeued and held: gdrprobe cannot check (a settings error" \
        in node.log()


def test_the_health_check_reports_a_settings_error_and_exits_0(node):
    node.settings("GDRPROBE_HEALTH_CHECK_TIMEOUT=1 minute")
    done = node(4, script=HEALTH_CHECK)
    assert done.returncode == 0 and node.checked() == []
    assert "health check: gdrprobe cannot check (a settings error, nothing checked) " \
           "(GDRPROBE_PROLOG_STRICT=1 drains)" in node.log()
    assert node.metrics("health_check")["gdrprobe_prolog_cannot_check"] == "1"


def test_values_are_read_as_a_shell_writes_them_and_exports_reach_gdrprobe(node):
    executable(node.bin / "gdrprobe", f"""\
        #!/bin/sh
        printf '%s|' "$@" >> {node.dir}/gdrprobe.args
        echo "$NCCL_IB_HCA;$LD_LIBRARY_PATH;${{NOT_EXPORTED-unset}}" >> {node.dir}/gdrprobe.env
        exit 0
        """)
    node.settings(
        "# a comment, then a blank line",
        "",
        "  GDRPROBE_CHECK_ARGS='--time-budget 7'\" -s 64K\"\\ --floor\\ 0 # and a comment",
        "export NCCL_IB_HCA=mlx5_0",
        'export LD_LIBRARY_PATH="/opt/lib:${BASE}$NCCL_IB_HCA \\"x\\""',
        "GDRPROBE_JOB_WITHOUT_GPUS=check\r")       # a file saved with Windows line ends
    assert node(0, BASE="/base:").returncode == 0, node.log()
    assert read(node.dir / "gdrprobe.args") == "check|--node|--time-budget|7|-s|64K|--floor|" \
                                               "0|--quiet|"
    assert read(node.dir / "gdrprobe.env") == 'mlx5_0;/opt/lib:/base:mlx5_0 "x";unset\n'


@pytest.mark.parametrize("given, seconds", [("8", 8), ("8s", 8), ("2m", 120), ("1h", 3600),
                                            ("1.5", 2), ("0.5m", 30), ("1d", 86400)])
def test_durations_are_read_as_timeout_and_slurm_write_them(node, given, seconds):
    executable(node.bin / "timeout", f"""\
        #!/bin/sh
        echo "$@" >> {node.dir}/timeout.args
        exit 124
        """)
    node.settings(f"GDRPROBE_PROLOG_TIMEOUT={given}", "GDRPROBE_PROLOG_KILL_AFTER=2s")
    done = node(0)
    assert done.returncode == 1
    assert read(node.dir / "timeout.args").startswith(f"-k 2 {seconds} ")
    assert node.reason() == f"gdrprobe: check stuck past {seconds} s"


def test_a_duration_with_a_unit_still_arms_the_watchdog(node):
    """`8s` made the watchdog's sleep $((8s + 2 + 1)) fail: a check that outlived SIGKILL
    held the prolog for ever. Here timeout(1) itself never returns."""
    executable(node.bin / "timeout", "#!/bin/sh\nexec sleep 20\n")
    node.settings("GDRPROBE_PROLOG_TIMEOUT=1s", "GDRPROBE_PROLOG_KILL_AFTER=1s")
    done = node(0)
    assert done.returncode == 1, done.stderr
    assert node.reason() == "gdrprobe: check stuck past 1 s"


USAGE = """\
usage: gdrprobe check [-h] [--gpu ORDINAL|BUS_ID] [--node] [--all-rails]
                      [-d DEVICE] [-i PORT] [-x INDEX] [--mem {gpu,dmabuf,peermem}]
                      [--time-budget SECONDS] [--repeats REPEATS]
gdrprobe check: error: unrecognized arguments: --tim 6
"""


@pytest.mark.parametrize("strict", ["0", "1"])
def test_only_argparses_error_line_reaches_the_log_and_the_reason(node, strict):
    (node.dir / "usage").write_text(USAGE)
    executable(node.bin / "gdrprobe", f"#!/bin/sh\ncat {node.dir}/usage >&2\nexit 2\n")
    node.settings(f"GDRPROBE_PROLOG_STRICT={strict}")
    node(2)
    assert "usage:" not in node.log() and "[-h]" not in node.log()
    assert "(exit 2)" in node.log()
    assert node.log().rstrip().endswith(
        ": gdrprobe check: error: unrecognized arguments: --tim 6")
    if strict == "1":
        assert node.reason() == "gdrprobe cannot check: exit 2: error: unrecognized " \
                                "arguments: --tim 6"


@pytest.mark.parametrize("how", ["in-its-directory", "by-path", "through-a-link"])
def test_the_health_check_runs_from_wherever_it_is_installed(node, tmp_path, how):
    installed = tmp_path / "opt" / "slurm-scripts"
    installed.mkdir(parents=True)
    for script in (PROLOG, HEALTH_CHECK):
        shutil.copy(script, installed)
    link = tmp_path / "elsewhere" / "health"
    link.parent.mkdir()
    link.symlink_to(installed / "gdrprobe-healthcheck.sh")
    command, cwd = {"in-its-directory": (["sh", "gdrprobe-healthcheck.sh"], installed),
                    "by-path": ([str(installed / "gdrprobe-healthcheck.sh")], "/"),
                    "through-a-link": (["sh", str(link)], tmp_path)}[how]
    os.chmod(installed / "gdrprobe-healthcheck.sh", 0o755)
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{node.bin}:/usr/bin:/bin", "FAKE_CODE": "4",
                               "SLURMD_NODENAME": NODE, "GDRPROBE_PROLOG_CONF": str(node.conf)})
    assert done.returncode == 0 and done.stderr == ""
    assert node.checked() == ["check --node --quiet"]
    assert node.reason().startswith("gdrprobe: exit 4:")


def test_a_health_check_without_its_prolog_says_where_it_looked(tmp_path):
    alone = tmp_path / "gdrprobe-healthcheck.sh"
    shutil.copy(HEALTH_CHECK, alone)
    done = subprocess.run(["sh", str(alone)], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert f"{tmp_path}/gdrprobe-prolog.sh not found" in done.stderr
