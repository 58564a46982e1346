"""lab/slurm.py's configuration for the lab's Slurm cluster: slurm.conf, the prolog's
settings file, and the run directory both guests read."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess

import pytest

from lab import slurm


def settings(text: str) -> dict[str, list[str]]:
    """slurm.conf's KEY=VALUE lines, each key with every value it was given."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        assert key and value, f"not KEY=VALUE: {line!r}"
        found.setdefault(key, []).append(value)
    return found


def test_slurm_conf_runs_the_repository_prolog_at_allocation():
    conf = settings(slurm.slurm_conf())
    assert conf["Prolog"] == [slurm.PROLOG]
    assert os.access(slurm.PROLOG, os.X_OK), "slurmd runs the prolog as an executable"
    assert conf["PrologFlags"] == ["Alloc,DeferBatch"]
    assert conf["MpiDefault"] == ["pmix"]


def test_slurm_conf_names_both_guests_by_their_wire_addresses():
    conf = settings(slurm.slurm_conf())
    assert conf["SlurmctldHost"] == ["gdr-a(10.77.0.1)"]
    assert conf["NodeName"] == ["gdr-a NodeAddr=10.77.0.1 CPUs=1 State=UNKNOWN",
                                "gdr-b NodeAddr=10.77.0.2 CPUs=1 State=UNKNOWN"]
    assert conf["PartitionName"][0].startswith("lab Nodes=gdr-a,gdr-b Default=YES")


def test_slurm_conf_keeps_state_and_logs_where_a_guest_can_write():
    conf = settings(slurm.slurm_conf())
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile"):
        assert conf[key][0].startswith(slurm.SPOOL + "/"), key
    for key in ("SlurmctldLogFile", "SlurmdLogFile"):
        assert conf[key][0].startswith(slurm.LOG_DIR + "/"), key


def sourced(text: str, tmp_path, variable: str) -> str:
    """What the prolog sees: the settings file sourced by sh."""
    path = tmp_path / "gdrprobe-prolog"
    path.write_text(text)
    return subprocess.run(["sh", "-c", f'. "$0"; printf %s "${variable}"', str(path)],
                          capture_output=True, text=True, timeout=30, check=True).stdout


def test_prolog_conf_without_the_stand_in_checks_the_real_node(tmp_path):
    text = slurm.prolog_conf(gdrprobe="/opt/with space/gdrprobe")
    assert sourced(text, tmp_path, "GDRPROBE") == "/opt/with space/gdrprobe"
    assert sourced(text, tmp_path, "GDRPROBE_CHECK_ARGS") == "--time-budget 60 -s 64K --repeats 2"
    assert sourced(text, tmp_path, "GDRPROBE_PROLOG_LOG") == slurm.PROLOG_LOG
    # The emulated guests' check outlives the defaults' 8 s: the prolog's limit follows it.
    assert sourced(text, tmp_path, "GDRPROBE_PROLOG_TIMEOUT") == "80"
    assert sourced(text, tmp_path, "GDRPROBE_PROLOG_KILL_AFTER") == "10"
    assert "LD_LIBRARY_PATH" not in text


def test_prolog_conf_over_the_stand_in_loads_it_and_widens_the_threshold(tmp_path):
    text = slurm.prolog_conf(standin="/tmp/gdrprobe-cuda-standin-0")
    assert sourced(text, tmp_path, "LD_LIBRARY_PATH") == "/tmp/gdrprobe-cuda-standin-0"
    assert sourced(text, tmp_path, "GDRPROBE_CHECK_ARGS").endswith(
        f"--threshold {slurm.LAB_THRESHOLD}")


def test_prepare_writes_a_fresh_private_munge_key_and_each_nodes_settings(tmp_path):
    first, second = tmp_path / "1", tmp_path / "2"
    first.mkdir()
    second.mkdir()
    slurm.prepare({"gdr-a": None, "gdr-b": "/standin"}, str(first))
    slurm.prepare({"gdr-a": None, "gdr-b": "/standin"}, str(second))
    key = (first / "munge.key").read_bytes()
    assert len(key) == slurm.MUNGE_KEY_BYTES
    assert key != (second / "munge.key").read_bytes()
    assert stat.S_IMODE((first / "munge.key").stat().st_mode) == 0o600
    assert (first / "slurm.conf").read_text() == slurm.slurm_conf()
    assert (first / "cgroup.conf").read_text() == slurm.cgroup_conf()
    assert "LD_LIBRARY_PATH" not in (first / "prolog-gdr-a").read_text()
    assert "LD_LIBRARY_PATH=/standin" in (first / "prolog-gdr-b").read_text()


def test_configure_node_installs_the_run_directory_where_each_program_looks(tmp_path,
                                                                              monkeypatch):
    if os.geteuid() != 0 or not has_munge_user():
        pytest.skip("needs root and the munge user (Debian's munge package): the key is "
                    "handed to munge")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    slurm.prepare({"gdr-a": None, "gdr-b": "/standin"}, str(run_dir))
    guest = tmp_path / "guest"
    for name, path in (("SLURM_CONF", "etc/slurm/slurm.conf"),
                       ("PROLOG_CONF", "etc/default/gdrprobe-prolog"),
                       ("MUNGE_KEY", "etc/munge/munge.key"), ("SPOOL", "var/spool/lab"),
                       ("LOG_DIR", "var/log/lab"), ("CGROUP_SLICE", "cgroup/system.slice")):
        monkeypatch.setattr(slurm, name, str(guest / path))
    slurm.configure_node(str(run_dir), "gdr-b")
    for name in ("slurm.conf", "cgroup.conf"):
        assert (guest / "etc/slurm" / name).read_text() == (run_dir / name).read_text()
    assert (guest / "etc/default/gdrprobe-prolog").read_text() == (
        run_dir / "prolog-gdr-b").read_text()
    key = guest / "etc/munge/munge.key"
    assert key.read_bytes() == (run_dir / "munge.key").read_bytes()
    assert stat.S_IMODE(key.stat().st_mode) == 0o400
    assert all((guest / path).is_dir() for path in ("var/spool/lab/ctld", "var/spool/lab/d",
                                                    "var/log/lab", "cgroup/system.slice"))


def has_munge_user() -> bool:
    try:
        pwd.getpwnam("munge")
        return True
    except KeyError:
        return False


def test_the_demos_operator_cases_change_what_the_prolog_reads(tmp_path, monkeypatch):
    conf = tmp_path / "gdrprobe-prolog"
    conf.write_text(slurm.prolog_conf())
    monkeypatch.setattr(slurm, "PROLOG_CONF", str(conf))
    slurm.with_prolog_settings(slurm.stuck_settings())
    assert sourced(conf.read_text(), tmp_path, "GDRPROBE") == slurm.STUCK_GDRPROBE
    assert sourced(conf.read_text(), tmp_path, "GDRPROBE_PROLOG_TIMEOUT") == "3"
    slurm.with_prolog_settings(slurm.misconfigured_settings())
    text = conf.read_text()
    assert sourced(text, tmp_path, "GDRPROBE") == "/opt/not-installed/gdrprobe"
    assert sourced(text, tmp_path, "GDRPROBE_PROLOG_STRICT") == "1"
    assert sourced(text, tmp_path, "GDRPROBE_PROLOG_TIMEOUT") == "80"   # the stuck case's went
    assert sourced(text, tmp_path, "GDRPROBE_PROLOG_METRICS_DIR") == slurm.TEXTFILE_DIR
    slurm.with_prolog_settings("")
    assert conf.read_text() == slurm.prolog_conf() + slurm.DEMO_MARK


def test_the_lab_allocates_gpus_as_gres_and_its_gpu_less_nodes_are_checked_whole(tmp_path):
    """GresTypes=gpu makes the prolog's default skip a job Slurm gave no GPU (the demo shows
    it); the guests declare no GPU, so their own settings check the whole node."""
    assert settings(slurm.slurm_conf())["GresTypes"] == ["gpu"]
    assert sourced(slurm.prolog_conf(), tmp_path, "GDRPROBE_JOB_WITHOUT_GPUS") == "check"
    extra = slurm.prolog_conf() + slurm.without_gpus_settings()
    assert sourced(extra, tmp_path, "GDRPROBE_JOB_WITHOUT_GPUS") == "auto"
    assert sourced(extra, tmp_path, "GDRPROBE") == slurm.MARKING_GDRPROBE


def test_the_demo_turns_away_a_job_of_each_kind_across_both_nodes():
    """sbatch (its script's srun), salloc (its srun) and srun each start tasks on both
    guests, and each task leaves the mark host b looks for (docs/slurm.md, "A hard gate")."""
    assert set(slurm.TURNED_AWAY) == {"sbatch", "salloc", "srun"}
    for kind, command in slurm.TURNED_AWAY.items():
        assert command.split()[0] == kind and slurm.BOTH_NODES in command
        assert "srun" in command and "turned-away-task-ran" in command
    marked = subprocess.run(["sh", "-c", slurm.MARK_TASK.replace(
        slurm.REFUSED_MARK, "/dev/null/never")], capture_output=True, text=True, timeout=30,
        env={"SLURMD_NODENAME": "gdr-b", "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"})
    assert marked.stdout == "task ran on gdr-b\n"


@pytest.mark.parametrize("line, drained", [
    ("gdr-b drained gdrprobe: exit 4: rxe0 port 1 is DOWN", True),
    ("gdr-b draining gdrprobe: exit 4: rxe0 port 1 is DOWN", True),
    ("gdr-b drained Prolog error", False),
    ("gdr-a drained gdrprobe: exit 4: ...", False),
    ("", False),
])
def test_sinfo_says_whether_the_node_drained_with_gdrprobes_reason(line, drained):
    assert slurm.drained_by_gdrprobe(line, "gdr-b") is drained
