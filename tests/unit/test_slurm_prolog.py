"""deploy/slurm/gdrprobe-prolog.sh, run as slurmd runs it, over a fake `gdrprobe` that exits
with a chosen code and a fake `scontrol` that records its arguments: every exit code of
the README's table gets the prolog action gdrprobe/errors.py gives it."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from gdrprobe.errors import (CANNOT_CHECK_CODES, DRAIN, DRAIN_CODES, EXIT_CODES, START, WARN,
                             ExitCode)
from tests.unit.fakes.prolog import HEALTH_CHECK, MESSAGE, NODE, PROLOG, executable, read

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")


@pytest.mark.parametrize("row", EXIT_CODES, ids=lambda row: f"exit{int(row.code)}")
def test_each_exit_code_gets_the_action_errors_py_gives_it(node, row):
    done = node(int(row.code))
    scontrol = read(node.dir / "scontrol.args").splitlines()
    log = read(node.dir / "prolog.log")
    if row.action == START:
        assert done.returncode == 0 and scontrol == [] and log == ""
    elif row.action == DRAIN:
        assert done.returncode == 1, done.stderr
        assert scontrol == ["update", f"nodename={NODE}", "state=drain",
                            f"reason=gdrprobe: exit {int(row.code)}: "
                            "GPUDirect RDMA not engaged on GPU 0000:3b:00.0 via mlx5_1"]
        assert f"node {NODE}, job 42: drain, the job is requeued and held: {MESSAGE}" in log
    elif row.code in CANNOT_CHECK_CODES:
        assert done.returncode == 0 and scontrol == []
        assert (f"gdrprobe cannot check (exit {int(row.code)}), the job starts "
                f"(GDRPROBE_PROLOG_STRICT=1 drains): {MESSAGE}") in log
    else:
        assert row.action == WARN
        assert done.returncode == 0 and scontrol == []
        assert f"warn (exit {int(row.code)}), the job starts: {MESSAGE}" in log


def test_it_checks_every_gpu_of_the_node_quietly_within_its_budget(node):
    node(0)
    assert read(node.dir / "gdrprobe.args") == "check --node --time-budget 6 --quiet\n"


def test_the_settings_file_names_the_command_and_its_arguments(node):
    wrapper = executable(node.dir / "wrapped-gdrprobe", f"""\
        #!/bin/sh
        echo wrapped >> {node.dir}/gdrprobe.args
        exec gdrprobe "$@"
        """)
    with node.conf.open("a") as conf:
        conf.write(f"GDRPROBE={wrapper}\nGDRPROBE_CHECK_ARGS='--time-budget 20 -d mlx5_0'\n")
    node(0)
    assert read(node.dir / "gdrprobe.args").splitlines() == [
        "wrapped", "check --node --time-budget 20 -d mlx5_0 --quiet"]


def test_a_long_reason_is_cut_to_what_sinfo_shows_in_one_line(node):
    long_message = "x" * 500
    executable(node.dir / "bin" / "gdrprobe", f"""\
        #!/bin/sh
        echo "{long_message}" >&2
        exit 1
        """)
    node(1)
    reason = read(node.dir / "scontrol.args").splitlines()[-1]
    assert reason.startswith("reason=gdrprobe: exit 1: xxx")
    assert len(reason) == len("reason=") + 200


def test_a_drain_scontrol_refuses_still_keeps_the_job_off_the_node(node):
    done = node(4, FAKE_SCONTROL_CODE="1")
    assert done.returncode == 1
    assert "scontrol could not drain node17" in read(node.dir / "prolog.log")


def test_no_gdrprobe_warns_and_lets_the_job_start(node):
    with node.conf.open("a") as conf:
        conf.write(f"GDRPROBE={node.dir}/not-installed/gdrprobe\n")
    done = node(0)
    assert done.returncode == 0
    log = read(node.dir / "prolog.log")
    assert "cannot check (exit 127), the job starts" in log and "not-installed/gdrprobe" in log


# ---- the job's GPUs (issue 28) -------------------------------------------------------------


def test_the_jobs_gpus_reach_the_check_in_slurmds_environment(node):
    node(0, SLURM_JOB_GPUS="0,2")
    assert read(node.dir / "gdrprobe.gpus") == "0,2\n"
    assert read(node.dir / "gdrprobe.args") == "check --node --time-budget 6 --quiet\n"


GRES_CONF = "ClusterName=lab\n  GresTypes=gpu,shard\nNodeName=node17 Gres=gpu:8\n"


def test_a_job_without_gpus_where_slurm_allocates_them_has_nothing_to_check(node):
    (node.dir / "slurm.conf").write_text(GRES_CONF)
    done = node(1)                      # the check would drain: it must not run at all
    assert done.returncode == 0 and read(node.dir / "gdrprobe.args") == ""
    assert read(node.dir / "scontrol.args") == ""
    assert ("node node17, job 42: start: the job has no GPU on this node (SLURM_JOB_GPUS "
            "unset): nothing to check") in read(node.dir / "prolog.log")


def test_without_gres_slurm_never_names_gpus_so_the_whole_node_is_checked(node):
    (node.dir / "slurm.conf").write_text("ClusterName=lab\nNodeName=node17 CPUs=1\n")
    node(0)
    assert read(node.dir / "gdrprobe.gpus") == "unset\n"
    assert read(node.dir / "gdrprobe.args") == "check --node --time-budget 6 --quiet\n"


@pytest.mark.parametrize("setting, runs", [("skip", False), ("check", True)])
def test_the_setting_decides_for_a_job_without_gpus(node, setting, runs):
    (node.dir / "slurm.conf").write_text(GRES_CONF if setting == "check" else "")
    with node.conf.open("a") as conf:
        conf.write(f"GDRPROBE_JOB_WITHOUT_GPUS={setting}\n")
    assert node(0).returncode == 0
    assert (read(node.dir / "gdrprobe.args") != "") == runs


def test_an_inconclusive_check_warns_and_the_job_starts(node):
    done = node(12, SLURM_JOB_GPUS="1")
    assert done.returncode == 0 and read(node.dir / "scontrol.args") == ""
    assert "warn (exit 12), the job starts:" in read(node.dir / "prolog.log")


# ---- the prolog's own log, fed hostile output (issue 30) ----------------------------------

HOSTILE = (b"GPU 0 \x1b[31mred\x1b[0m \\c glued\r over\x00 \xff \xc2\x9b2J caf\xc3\xa9\n"
           b"second line\n")


def saying(node, output: bytes) -> None:
    """The fake gdrprobe writes `output` (any bytes) on stderr and exits $FAKE_CODE."""
    (node.dir / "said").write_bytes(output)
    executable(node.dir / "bin" / "gdrprobe", f"""\
        #!/bin/sh
        cat {node.dir}/said >&2
        exit "$FAKE_CODE"
        """)


def records(node) -> list[str]:
    """The log file's lines: each must be valid UTF-8."""
    return (node.dir / "prolog.log").read_bytes().decode("utf-8").splitlines()


def test_hostile_output_is_one_escaped_record_in_the_log(node):
    saying(node, HOSTILE)
    assert node(9).returncode == 0
    [record] = records(node)
    assert record.endswith(
        "warn (exit 9), the job starts: GPU 0 \\x1b[31mred\\x1b[0m \\\\c glued\\x0d over "
        "\\xff \\x9b2J café\\nsecond line")


def test_the_drain_reason_has_no_control_characters(node):
    saying(node, HOSTILE)
    assert node(1).returncode == 1
    reason = read(node.dir / "scontrol.args").splitlines()[-1]
    assert reason == "reason=gdrprobe: exit 1: GPU 0 [31mred[0m \\c glued over  2J café"
    [record] = records(node)
    assert "drain, the job is requeued and held: GPU 0 \\x1b[31mred" in record


# What a terminal, a log reader or sinfo takes for a line break, hides or reorders text,
# and what no UTF-8 encoder writes (issue 43 item 3).
HIDDEN = ("U+2028 \u2028 U+2029 \u2029 U+FFFE \ufffe U+FFFF \uffff U+10FFFF \U0010ffff "
          "RLO \u202e ZWSP \u200b BOM \ufeff SHY \u00ad private \ue000 tag \U000e0041 "
          "kept \u00e9\u4e2d\U0001f600").encode()
NOT_UTF8 = b" overlong \xc0\xaf \xe0\x80\xaf surrogate \xed\xa0\x80 past \xf4\x90\x80\x80"


def test_hidden_characters_and_what_is_not_utf8_never_reach_the_drain_reason(node):
    saying(node, HIDDEN + NOT_UTF8 + b"\n")
    assert node(1).returncode == 1
    reason = read(node.dir / "scontrol.args").splitlines()[-1]
    assert reason == ("reason=gdrprobe: exit 1: U+2028  U+2029  U+FFFE  U+FFFF  U+10FFFF  RLO  "
                      "ZWSP  BOM  SHY  private  tag  kept \u00e9\u4e2d\U0001f600 overlong   "
                      "surrogate  past ")
    [record] = records(node)
    assert "U+2028 \\xe2\\x80\\xa8 U+2029" in record and "past \\xf4\\x90\\x80\\x80" in record
    assert "\u2028" not in record and "\ufffe" not in record


def test_output_past_what_logger_takes_still_logs_one_bounded_record(node):
    """Over 128 KiB in one argument, exec(logger) failed (E2BIG) and the drain was never
    logged: the record is cut to LOG_RECORD_MAX bytes, the drain still happens."""
    logged = node.dir / "logger.args"
    executable(node.dir / "bin" / "logger", f"""\
        #!/bin/sh
        printf '%s\\n' "$@" >> {logged}
        """)
    node.conf.write_text("")                          # no log file: syslog through logger
    saying(node, b"x" * (200 * 1024) + b"\n")
    assert node(1).returncode == 1
    assert read(node.dir / "scontrol.args").splitlines()[0] == "update"
    *options, record = logged.read_bytes().splitlines()
    assert options == [b"-t", b"gdrprobe-prolog", b"--"]
    assert record.startswith(b"gdrprobe-prolog: node node17, job 42: drain, the job is requeued and held: xxx")
    assert record.endswith(b"x...") and len(record) <= 1024


def test_utf8_is_cut_on_a_character_boundary(node):
    saying(node, "é".encode() * 800 + b"\n")
    assert node(1).returncode == 1
    [record] = records(node)                          # decodes: no half character
    assert record.endswith("é...") and len(record.encode()) <= 1024
    reason = read(node.dir / "scontrol.args").splitlines()[-1]
    assert reason.endswith("é...") and len(reason.encode()) <= len("reason=") + 200


# ---- no search path, its own time limit, the health check (issue 29 item 4) ---------------

def limited(node, seconds: int = 1, kill_after: int = 1) -> None:
    with node.conf.open("a") as conf:
        conf.write(f"GDRPROBE_PROLOG_TIMEOUT={seconds}\nGDRPROBE_PROLOG_KILL_AFTER={kill_after}\n")


@pytest.mark.parametrize("body", ["exec sleep 30", "trap '' TERM; sleep 30"],
                         ids=["stops-on-sigterm", "needs-sigkill"])
def test_a_stuck_check_is_killed_by_the_prologs_own_limit_and_drains(node, body):
    executable(node.dir / "bin" / "gdrprobe", f"""\
        #!/bin/sh
        echo "waiting for the driver" >&2
        {body}
        """)
    limited(node)
    done = node(0)
    assert done.returncode == 1, done.stderr
    assert read(node.dir / "scontrol.args").splitlines() == [
        "update", f"nodename={NODE}", "state=drain", "reason=gdrprobe: check stuck past 1 s"]
    assert ("drain, the job is requeued and held: gdrprobe check stuck past 1 s, killed by "
            "the prolog's own limit: waiting for the driver") in read(node.dir / "prolog.log")


def test_a_check_not_even_sigkill_ends_is_left_behind_and_drains(node):
    """A process stuck in the kernel outlives SIGKILL: here timeout(1) itself never returns."""
    executable(node.dir / "bin" / "timeout", "#!/bin/sh\nexec sleep 6\n")
    limited(node)
    done = node(0)
    assert done.returncode == 1
    assert read(node.dir / "scontrol.args").splitlines()[-1] == (
        "reason=gdrprobe: check stuck past 1 s")


def test_the_default_limit_keeps_a_job_start_within_slurms_message_timeout(node):
    node(0)
    assert read(node.dir / "gdrprobe.args") == "check --node --time-budget 6 --quiet\n"
    prolog = open(PROLOG).read()
    assert "GDRPROBE_PROLOG_TIMEOUT=8\nGDRPROBE_PROLOG_KILL_AFTER=2\n" in prolog  # 10 s at most


def test_gdrprobe_not_where_the_settings_say_names_the_fix(node):
    with node.conf.open("a") as conf:
        conf.write("GDRPROBE=gdrprobe-not-on-any-path\n")
    done = node(0)
    assert done.returncode == 0
    assert ("cannot check (exit 127), the job starts (GDRPROBE_PROLOG_STRICT=1 drains): "
            "gdrprobe not found: "
            "GDRPROBE=gdrprobe-not-on-any-path; set GDRPROBE in "
            f"{node.conf} to its absolute path (slurmd gives a prolog no search path)"
            ) in read(node.dir / "prolog.log")



def test_a_python_that_dies_before_gdrprobe_starts_never_drains(node):
    """A venv whose gdrprobe package is gone: the console script's import fails, Python
    prints a traceback and exits 1, which is not gdrprobe's "not engaged" but a broken
    install: it cannot check (70), a warning, and in strict mode a drain saying so."""
    broken = executable(node.dir / "broken-gdrprobe", f"""\
        #!{sys.executable}
        from gdrprobe_not_installed.cli import main
        """)
    with node.conf.open("a") as conf:
        conf.write(f"GDRPROBE={broken}\n")
    done = node(0)
    assert done.returncode == 0 and read(node.dir / "scontrol.args") == ""
    assert ("cannot check (exit 70), the job starts (GDRPROBE_PROLOG_STRICT=1 drains): "
            "gdrprobe did not start (a Python traceback; reinstall gdrprobe for "
            f"{broken}): ModuleNotFoundError: No module named 'gdrprobe_not_installed'"
            ) in read(node.dir / "prolog.log")
    with node.conf.open("a") as conf:
        conf.write("GDRPROBE_PROLOG_STRICT=1\n")
    assert node(0).returncode == 1
    assert read(node.dir / "scontrol.args").splitlines()[-1].startswith(
        "reason=gdrprobe cannot check: exit 70: gdrprobe did not start")

def test_without_a_search_path_the_prolog_still_finds_its_commands(node):
    """slurmd runs the prolog with no PATH: the system's commands are found all the same."""
    with node.conf.open("a") as conf:
        conf.write(f"GDRPROBE={node.dir}/bin/gdrprobe\n")
    environment = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "42", "FAKE_CODE": "9",
                   "GDRPROBE_PROLOG_CONF": str(node.conf)}
    done = subprocess.run(["/bin/sh", PROLOG], env=environment, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert f"warn (exit 9), the job starts: {MESSAGE}" in read(node.dir / "prolog.log")


def test_the_health_check_checks_every_gpu_drains_and_exits_0(node):
    done = subprocess.run(["sh", HEALTH_CHECK], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{node.dir}/bin:/usr/bin:/bin", "FAKE_CODE": "4",
                               "SLURMD_NODENAME": NODE, "SLURM_JOB_GPUS": "3",
                               "GDRPROBE_PROLOG_CONF": str(node.conf)})
    assert done.returncode == 0, done.stderr
    assert read(node.dir / "gdrprobe.gpus") == "unset\n"
    assert read(node.dir / "gdrprobe.args") == "check --node --quiet\n"
    assert read(node.dir / "scontrol.args").splitlines()[-1].startswith(
        "reason=gdrprobe: exit 4: GPUDirect RDMA not engaged")
    assert f"node {NODE}, health check: drain: {MESSAGE}" in read(node.dir / "prolog.log")


# ---- checks that cannot run reach the operator (issue 29 item 5) --------------------------


def test_the_prologs_codes_are_errors_py():
    text = open(PROLOG).read()
    assert f'DRAIN_CODES="{" ".join(str(int(c)) for c in DRAIN_CODES)}"' in text
    shell = " ".join(str(int(c)) for c in CANNOT_CHECK_CODES) + " 126 127"
    assert f'CANNOT_CHECK_CODES="{shell}"' in text
    assert f"NOT_STARTED={int(ExitCode.INTERNAL)}" in text


@pytest.mark.parametrize("code", [2, 3, 70, 126, 127])
def test_strict_mode_drains_a_check_that_cannot_run_with_its_own_reason(node, code):
    with node.conf.open("a") as conf:
        conf.write("GDRPROBE_PROLOG_STRICT=1\n")
    done = node(code)
    assert done.returncode == 1
    assert read(node.dir / "scontrol.args").splitlines()[-1] == (
        f"reason=gdrprobe cannot check: exit {code}: GPUDirect RDMA not engaged on GPU "
        "0000:3b:00.0 via mlx5_1")
    assert node.metrics()["gdrprobe_prolog_cannot_check"] == "1"


@pytest.mark.parametrize("code, cannot", [(70, "1"), (0, "0"), (1, "0"), (12, "0")])
def test_every_check_leaves_its_code_in_the_textfile_metric(node, code, cannot):
    node(code)
    found = node.metrics()
    assert found["gdrprobe_prolog_exit_code"] == str(code)
    assert found["gdrprobe_prolog_cannot_check"] == cannot
    assert int(found["gdrprobe_prolog_timestamp_seconds"]) > 1_600_000_000
    assert [p.name for p in (node.dir / "textfile").iterdir()] == ["gdrprobe_prolog.prom"]


def test_gdrprobe_missing_is_a_metric_even_where_nothing_drains(node):
    with node.conf.open("a") as conf:
        conf.write(f"GDRPROBE={node.dir}/not-installed/gdrprobe\n")
    assert node(0).returncode == 0
    assert node.metrics() | {"gdrprobe_prolog_timestamp_seconds": "-"} == {
        "gdrprobe_prolog_exit_code": "127", "gdrprobe_prolog_cannot_check": "1",
        "gdrprobe_prolog_timestamp_seconds": "-"}


def test_a_stuck_check_is_a_metric_too(node):
    executable(node.dir / "bin" / "gdrprobe", "#!/bin/sh\nexec sleep 30\n")
    limited(node)
    node(0)
    assert node.metrics()["gdrprobe_prolog_exit_code"] == "124"
    assert node.metrics()["gdrprobe_prolog_cannot_check"] == "1"


def test_the_health_check_has_its_own_metric_file(node):
    subprocess.run(["sh", HEALTH_CHECK], capture_output=True, text=True, timeout=30,
                   env={"PATH": f"{node.dir}/bin:/usr/bin:/bin", "FAKE_CODE": "3",
                        "SLURMD_NODENAME": NODE, "GDRPROBE_PROLOG_CONF": str(node.conf)})
    assert node.metrics("health_check")["gdrprobe_prolog_cannot_check"] == "1"
    assert not (node.dir / "textfile" / "gdrprobe_prolog.prom").exists()
