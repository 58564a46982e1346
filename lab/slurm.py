"""A real Slurm cluster across the two lab guests: munge, slurmctld on host a, slurmd on both.

Debian's own daemons (slurm-wlm 22.05, munge), started by hand in the guests rather than
by systemd (the guests have none). The host prepares a run directory before the guests
boot; both guests see it through their read-only view of the host's /tmp:

  munge.key      a fresh random key for this run, so that the two guests' munged trust
                 each other and nothing else (1024 bits, as Debian's package makes one;
                 mungekey(8) takes 256 to 8192)
  slurm.conf     two nodes, gdr-a (10.77.0.1, also the controller) and gdr-b (10.77.0.2),
                 the repository's prolog (deploy/slurm/gdrprobe-prolog.sh) as Prolog=,
                 with the PrologFlags that make it a hard gate (docs/slurm.md)
  cgroup.conf    slurmd's cgroup settings for guests without systemd
  prolog-NODE    what the prolog reads as /etc/default/gdrprobe-prolog on that node

Each guest copies them into its writable /etc overlay, where Slurm's commands look by
default (/etc/slurm/slurm.conf), and keeps state and logs under /var/spool and /var/log.

  python -m lab.slurm node RUN_DIR NAME            munged and slurmd -D until slurmctld says
                                                   to shut down, then whether a task of a
                                                   job turned away ran here (host b)
  python -m lab.slurm demo RUN_DIR                 munged, slurmctld and slurmd; the demo's
                                                   jobs once both nodes are idle; then the
                                                   cluster shut down (host a)
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from lab.kernel import REPO, LabError
from lab.vm import HOST_ADDRESSES

PROLOG = os.path.join(REPO, "deploy", "slurm", "gdrprobe-prolog.sh")
GDRPROBE = os.path.join(REPO, ".venv", "bin", "gdrprobe")
NODES = {f"gdr-{host}": address for host, address in HOST_ADDRESSES.items()}
CONTROLLER = "gdr-a"
CLUSTER_NAME = "gdrlab"
MUNGE_KEY_BYTES = 128
SPOOL = "/var/spool/gdrprobe-lab"
LOG_DIR = "/var/log/gdrprobe-lab"
SLURM_CONF = "/etc/slurm/slurm.conf"
PROLOG_CONF = "/etc/default/gdrprobe-prolog"
MUNGE_KEY = "/etc/munge/munge.key"
CGROUP_SLICE = "/sys/fs/cgroup/system.slice"
PROLOG_LOG = os.path.join(LOG_DIR, "prolog.log")
# The lab's guests run under emulation: a check of the stand-in "GPU" takes about 25 s there,
# so the prolog's budget and its own limit (SIGTERM, then SIGKILL) are the lab's, not the
# defaults sized for Slurm's MessageTimeout on real nodes.
PROLOG_TIME_BUDGET_S = 60
PROLOG_TIMEOUT_S = 80
PROLOG_KILL_AFTER_S = 10
NODES_IDLE_TIMEOUT_S = 120
JOB_TIMEOUT_S = 240
# One rank per node, host memory (the guests have no GPU), Open MPI's own traffic off the
# RDMA device (docs/cluster.md); srun wires the ranks through PMIx (MpiDefault below).
# Hardly any pair named slow: which emulated pair is slower means nothing (docs/cluster.md).
CLUSTER = f"{GDRPROBE} cluster --mem host -s 1M -n 100 --slow-fraction 0.01"
MATRIX_SRUN = f"OMPI_MCA_btl=self,tcp srun -N2 --ntasks-per-node=1 {CLUSTER}"
# The same under the allocation's mpirun: Open MPI starts its daemons through srun.
MATRIX_MPIRUN = (f"mpirun --allow-run-as-root --mca btl self,tcp --map-by ppr:1:node "
                 f"{CLUSTER}")
# sinfo -R with the whole reason (its default format cuts it at 20 characters).
SINFO_REASONS = "%N %T %E"
# A real fault: host b's RDMA port loses its link while the node's other traffic (here
# Slurm's, on the same wire) goes on, as with a pulled cable or a failed switch port:
# rxe0 is made again on a netdev that has no link, and the kernel reports its port DOWN
# (a device taken away altogether is "not testable" under the GPU arm, a warning).
FAULT = ("ip link add gdr-nolink type dummy && rdma link delete rxe0 && "
         "rdma link add rxe0 type rxe netdev gdr-nolink")
# The three ways a job starts, each turned away from host b once its port is down, across
# both nodes (host a's prolog lets a job without GPUs start at once): no task of any may run
# on host b (docs/slurm.md, "A hard gate"). Each task leaves a mark on the node it ran on;
# host b's own process looks for marks once its slurmd has stopped.
REFUSED_MARK = os.path.join(LOG_DIR, "turned-away-task-ran")
MARK_TASK = ("sh -c " + shlex.quote(f"touch {REFUSED_MARK}-$SLURM_JOB_ID-$SLURMD_NODENAME; "
                                    "echo task ran on $SLURMD_NODENAME"))
BOTH_NODES = "-N2 -w gdr-a,gdr-b"
TURNED_AWAY = {
    "sbatch": (f"sbatch --parsable {BOTH_NODES} -o {LOG_DIR}/batch-%j.out --wrap "
               + shlex.quote(f"srun {BOTH_NODES} {MARK_TASK}")),
    "salloc": f"salloc {BOTH_NODES} --immediate={JOB_TIMEOUT_S} srun {BOTH_NODES} {MARK_TASK}",
    "srun": f"srun {BOTH_NODES} --immediate={JOB_TIMEOUT_S} {MARK_TASK}",
}
# A batch job's states once its prolog failed: requeued (and held), or ended; while RUNNING,
# CONFIGURING or COMPLETING it may still be on the node.
BATCH_SETTLED = ("PENDING", "REQUEUE_HOLD", "REQUEUED", "SPECIAL_EXIT", "CANCELLED", "FAILED",
                 "COMPLETED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE")
DAEMON_START_TIMEOUT_S = 30
# The prolog's own limit in the demo's stuck check: a gdrprobe that never answers (as a
# driver call that never returns) is killed after this, and the node drains with that reason.
STUCK_LIMIT_S = 3
STUCK_KILL_AFTER_S = 2
STUCK_GDRPROBE = os.path.join(LOG_DIR, "stuck-gdrprobe")
# A GDRPROBE that is not installed, in strict mode: a configuration error that drains.
MISSING_GDRPROBE = "/opt/not-installed/gdrprobe"
# A GDRPROBE that leaves a mark and fails as a broken node would: had the prolog checked a
# job with no GPU, it would have measured GPUs that are not the job's and drained the node.
MARKING_GDRPROBE = os.path.join(LOG_DIR, "marking-gdrprobe")
MARK = os.path.join(LOG_DIR, "gdrprobe-ran")
TEXTFILE_DIR = os.path.join(LOG_DIR, "textfile")
# Host memory at both ends of the stand-in's A/B: the ratio is noise around 1, which the
# emulated guests spread wider than the default 0.9 allows.
LAB_THRESHOLD = 0.5


def slurm_conf(prolog: str = PROLOG, nodes: dict[str, str] = NODES,
               controller: str = CONTROLLER) -> str:
    """slurm.conf for the lab (slurm.conf(5) of Slurm 22.05): root runs every daemon, no
    cgroups or accounting (the guests have neither), one CPU per node, the gdrprobe prolog
    at allocation with a batch script held until every node's prolog is over
    (PrologFlags=Alloc,DeferBatch: docs/slurm.md, "A hard gate"), PMIx as srun's default MPI
    wiring (mpi_pmix from slurm-wlm-basic-plugins, the PMIx Debian's Open MPI 4.1 is built
    with)."""
    lines = [
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={controller}({nodes[controller]})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={SPOOL}/ctld",
        f"SlurmdSpoolDir={SPOOL}/d",
        f"SlurmctldPidFile={SPOOL}/slurmctld.pid",
        f"SlurmdPidFile={SPOOL}/slurmd.pid",
        f"SlurmctldLogFile={LOG_DIR}/slurmctld.log",
        f"SlurmdLogFile={LOG_DIR}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "MpiDefault=pmix",
        "MailProg=/bin/true",   # no mail in the lab (slurmctld checks the default exists)
        # GPUs are allocated as GRES here, as on a shared GPU cluster: a job Slurm gave no GPU
        # has none to check (the prolog's GDRPROBE_JOB_WITHOUT_GPUS=auto). The guests declare
        # no gpu GRES (they have no GPU): their prolog settings check the whole node.
        "GresTypes=gpu",
        f"Prolog={prolog}",
        "PrologFlags=Alloc,DeferBatch",
        # A node drained by the prolog stays drained; one that was only down comes back.
        "ReturnToService=2",
        # Emulated guests answer slowly: give slurmd time before it is declared down.
        "SlurmdTimeout=300",
        "MessageTimeout=60",
    ]
    lines += [f"NodeName={name} NodeAddr={address} CPUs=1 State=UNKNOWN"
              for name, address in nodes.items()]
    lines.append(f"PartitionName=lab Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
                 "State=UP")
    return "\n".join(lines) + "\n"


def cgroup_conf() -> str:
    """cgroup.conf: slurmd 22.05 always starts its cgroup plugin (cgroup.conf(5)), and on the
    guests' cgroup v2 it would ask systemd over D-Bus for its scope; the guests run neither,
    so slurmd makes the hierarchy itself."""
    return "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"


def prolog_conf(gdrprobe: str = GDRPROBE, standin: str | None = None,
                log: str = PROLOG_LOG) -> str:
    """/etc/default/gdrprobe-prolog for a lab node. With `standin` (a directory holding the
    stand-in libcuda.so.1, tests/cuda_standin), the check runs over it and reaches a measured
    verdict: the gate's plumbing under slurmd, not GPU proof. Without it the guest has no
    GPU and the check answers "not testable" (exit 9: warn)."""
    arguments = f"--time-budget {PROLOG_TIME_BUDGET_S} -s 64K --repeats 2"
    lines = [f"GDRPROBE={shlex.quote(gdrprobe)}", f"GDRPROBE_PROLOG_LOG={shlex.quote(log)}",
             f"GDRPROBE_PROLOG_TIMEOUT={PROLOG_TIMEOUT_S}",
             f"GDRPROBE_PROLOG_KILL_AFTER={PROLOG_KILL_AFTER_S}",
             f"GDRPROBE_PROLOG_METRICS_DIR={shlex.quote(TEXTFILE_DIR)}",
             "GDRPROBE_JOB_WITHOUT_GPUS=check"]
    if standin:
        arguments += f" --threshold {LAB_THRESHOLD}"
        lines.append(f"export LD_LIBRARY_PATH={shlex.quote(standin)}")
    lines.insert(1, f"GDRPROBE_CHECK_ARGS={shlex.quote(arguments)}")
    return "\n".join(lines) + "\n"


def prepare(standin_nodes: dict[str, str | None], directory: str | None = None) -> str:
    """The run directory the guests read: a fresh munge key, slurm.conf, and each node's
    prolog settings (standin_nodes: node name -> stand-in directory or None)."""
    run_dir = directory or tempfile.mkdtemp(prefix="gdrprobe-slurm-")
    with open(os.path.join(run_dir, "munge.key"), "wb") as key:
        os.fchmod(key.fileno(), 0o600)
        key.write(os.urandom(MUNGE_KEY_BYTES))
    for name, text in (("slurm.conf", slurm_conf()), ("cgroup.conf", cgroup_conf())):
        with open(os.path.join(run_dir, name), "w") as conf:
            conf.write(text)
    for name, standin in standin_nodes.items():
        with open(os.path.join(run_dir, f"prolog-{name}"), "w") as conf:
            conf.write(prolog_conf(standin=standin))
    return run_dir


# --- in a guest ---------------------------------------------------------------------------

def install(source: str, target: str, mode: int, owner: str = "root") -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(source, target)
    os.chmod(target, mode)
    shutil.chown(target, owner, owner)


def run(argv: list[str], timeout: float = DAEMON_START_TIMEOUT_S) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)} exited {done.returncode}: "
                       f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def configure_node(run_dir: str, name: str) -> None:
    """This guest's munge key, slurm.conf and prolog settings, from the run directory."""
    install(os.path.join(run_dir, "munge.key"), MUNGE_KEY, 0o400, "munge")
    for conf in ("slurm.conf", "cgroup.conf"):
        install(os.path.join(run_dir, conf), os.path.join(os.path.dirname(SLURM_CONF), conf),
                0o644)
    install(os.path.join(run_dir, f"prolog-{name}"), PROLOG_CONF, 0o644)
    for directory in (f"{SPOOL}/ctld", f"{SPOOL}/d", LOG_DIR, TEXTFILE_DIR):
        os.makedirs(directory, exist_ok=True)
    # Where slurmd puts its stepd scope on cgroup v2 without systemd: it makes the scope,
    # but not the slice systemd would have made above it.
    os.makedirs(CGROUP_SLICE, exist_ok=True)


def start_munge() -> None:
    """munged as the munge user, as Debian's service runs it, with Debian's paths: the
    socket in /run/munge, where Slurm's auth/munge looks by default."""
    for directory in ("/run/munge", "/var/log/munge"):
        os.makedirs(directory, mode=0o755, exist_ok=True)
        shutil.chown(directory, "munge", "munge")
    run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
    run(["sh", "-c", "munge -n | unmunge"])


def start_daemon(argv: list[str], log: str) -> subprocess.Popen:
    """A Slurm daemon in the foreground (-D), its output in log; it is ready when it has
    written its log file's first lines and is still running."""
    with open(log, "ab") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    time.sleep(1)
    if process.poll() is not None:
        raise LabError(f"{argv[0]} exited {process.returncode} at start:\n" + tail(log))
    return process


def tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError as error:
        return f"({path}: {error})"


def start_slurmd(name: str) -> subprocess.Popen:
    return start_daemon(["/usr/sbin/slurmd", "-D", "-N", name], f"{LOG_DIR}/slurmd.out")


def wait_for_idle_nodes(daemons: list[subprocess.Popen],
                        timeout: float = NODES_IDLE_TIMEOUT_S) -> None:
    """Until sinfo shows every node idle: both slurmd have registered with slurmctld."""
    deadline = time.monotonic() + timeout
    states = ""
    while time.monotonic() < deadline:
        for daemon in daemons:
            if daemon.poll() is not None:
                raise LabError(f"{daemon.args[0]} exited {daemon.returncode}:\n"
                               + tail(f"{LOG_DIR}/slurmd.log") + tail(f"{LOG_DIR}/slurmctld.log"))
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True,
                              text=True, timeout=60)
        states = done.stdout.strip()
        lines = states.splitlines()
        if done.returncode == 0 and len(lines) == len(NODES) and all(
                line.split()[1] == "idle" for line in lines):
            return
        time.sleep(2)
    raise LabError(f"the nodes did not become idle in {timeout:.0f} s: {states or 'no answer'}"
                   f"\nslurmctld:\n{tail(f'{LOG_DIR}/slurmctld.log')}")


def serve_node(run_dir: str, name: str) -> int:
    """Host b: slurmd in the foreground until slurmctld shuts the cluster down; then its
    prolog's log, and whether a task of a job its prolog turned away ran here."""
    configure_node(run_dir, name)
    start_munge()
    slurmd = start_slurmd(name)
    code = slurmd.wait()
    print(f"slurmd on {name} exited {code}")
    if code != 0:
        print(tail(f"{LOG_DIR}/slurmd.log"))
    print(f"the prolog's log on {name}:\n{tail(PROLOG_LOG)}")
    ran = sorted(glob.glob(f"{REFUSED_MARK}-*"))
    print(f"demo-slurm: {'FAIL' if ran else 'ok  '} no task of a job turned away from {name} "
          f"ran there{': ' + ', '.join(ran) if ran else ''}")
    return code or int(bool(ran))


def run_controller(run_dir: str, body: Callable[[], int]) -> int:
    """Host a: the whole cluster up, `body` run once both nodes are idle, then every daemon
    shut down (`scontrol shutdown` stops slurmctld and every slurmd, scontrol(1))."""
    configure_node(run_dir, CONTROLLER)
    start_munge()
    controller = start_daemon(["/usr/sbin/slurmctld", "-D"],
                              f"{LOG_DIR}/slurmctld.out")
    slurmd = start_slurmd(CONTROLLER)
    try:
        wait_for_idle_nodes([controller, slurmd])
        return body()
    finally:
        subprocess.run(["scontrol", "shutdown"], timeout=60)
        for process in (slurmd, controller):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def demo() -> int:
    """One allocation on both nodes, whose prolog checks each node (host a has no GPU and
    no stand-in: not testable, a warning, the job starts; host b checks over the stand-in:
    engaged); in it the node x node matrix under srun and under mpirun, then host b's RDMA
    port loses its link (FAULT). The next job of each kind (sbatch, salloc, srun) meets a
    failing check on host b: the prolog drains the node with the gate's reason, which
    `sinfo -R` shows, and turns the job away before any task runs there (turned_away). Then
    on host a, what reaches the operator (operator_cases): a stuck check and a
    configuration error."""
    steps = f"{MATRIX_SRUN} && {MATRIX_MPIRUN} && srun -N1 -w gdr-b sh -c {shlex.quote(FAULT)}"
    matrix = sh(f"salloc -N2 sh -c {shlex.quote(steps)}", JOB_TIMEOUT_S)
    warned = "warn (exit 9)" in tail(PROLOG_LOG)
    outcomes = turned_away("gdr-b")
    outcomes |= operator_cases()
    sh(f"cat {PROLOG_LOG}", 10)
    outcomes |= {
        "the matrix ran across both guests under srun and mpirun": matrix.returncode == 0
        and matrix.stdout.count("every pair measured") == 2,
        "host a's check warned and its job started": warned,
    }
    for outcome, held in outcomes.items():
        print(f"demo-slurm: {'ok  ' if held else 'FAIL'} {outcome}")
    return 0 if all(outcomes.values()) else 1


def turned_away(node: str) -> dict[str, bool]:
    """A job of each kind across both nodes, `node`'s port down: its prolog drains it with
    gdrprobe's reason and turns the job away, no task starts there (the marks: serve_node),
    and the node is resumed for the next kind. Host a lets jobs without GPUs start unchecked,
    so that the demo waits on host b's prolog alone."""
    with_prolog_settings("GDRPROBE_JOB_WITHOUT_GPUS=auto\n")
    outcomes = {}
    for kind, command in TURNED_AWAY.items():
        done = sh(command, JOB_TIMEOUT_S)
        ran = done.stdout + done.stderr
        if kind == "sbatch":
            ran += settled_batch_job(done.stdout.strip().split(";")[0])
        drained = sh(f"sinfo -R -h -n {node} -o {shlex.quote(SINFO_REASONS)}", 60)
        sh(f"scontrol update nodename={node} state=resume", 60)
        outcomes[f"{kind}: no task ran on {node}, drained with gdrprobe's reason"] = (
            f"task ran on {node}" not in ran and drained_by_gdrprobe(drained.stdout, node))
    return outcomes


def drained_by_gdrprobe(sinfo: str, node: str) -> bool:
    """Whether `sinfo -R -o SINFO_REASONS` says `node` is drained (or draining, while the
    job turned away completes) with a reason of gdrprobe's."""
    fields = sinfo.split()
    return (fields[:1] == [node] and fields[1:2] in (["drained"], ["draining"])
            and fields[2:3] == ["gdrprobe:"])


def settled_batch_job(job: str) -> str:
    """What batch job `job` printed once its prolog's answer is in (requeued and held, or
    ended: BATCH_SETTLED), then the job cancelled, held or not, so that nothing waits."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        shown = run(["scontrol", "show", "job", "-o", job], 60)
        fields = dict(field.partition("=")[::2] for field in shown.split())
        state = fields.get("JobState", "")
        if state in BATCH_SETTLED and (fields.get("Restarts", "0") != "0"
                                       or state != "PENDING"):
            break
        time.sleep(2)
    else:
        raise LabError(f"batch job {job} did not settle in {JOB_TIMEOUT_S} s: {fields}")
    print(f"batch job {job}: " + " ".join(f"{key}={fields.get(key, '')}" for key in
                                          ("JobState", "Reason", "Restarts", "BatchHost")))
    sh(f"scancel {shlex.quote(job)}", 60)
    return tail(os.path.join(LOG_DIR, f"batch-{job}.out"))


def stuck_settings() -> str:
    """Lines appended to a node's prolog settings: a gdrprobe that never answers, and the
    prolog's own limit short enough for the demo."""
    return (f"GDRPROBE={shlex.quote(STUCK_GDRPROBE)}\n"
            f"GDRPROBE_PROLOG_TIMEOUT={STUCK_LIMIT_S}\n"
            f"GDRPROBE_PROLOG_KILL_AFTER={STUCK_KILL_AFTER_S}\n")


def misconfigured_settings() -> str:
    """Lines appended to a node's prolog settings: gdrprobe not where they say, in strict
    mode, so that the configuration error drains the node with its own reason."""
    return f"GDRPROBE={shlex.quote(MISSING_GDRPROBE)}\nGDRPROBE_PROLOG_STRICT=1\n"


def with_prolog_settings(extra: str) -> None:
    """This node's prolog settings as prepared, with `extra` appended (later lines win)."""
    with open(PROLOG_CONF) as conf:
        base = conf.read().split(DEMO_MARK)[0]
    with open(PROLOG_CONF, "w") as conf:
        conf.write(base + DEMO_MARK + extra)


DEMO_MARK = "# --- the demo's change ---\n"


def job_ran_on(node: str) -> bool:
    """Whether a job on `node` ran its command: srun's own exit status is no answer, since
    srun 22.05 may exit 0 for a step aborted by a failed prolog."""
    job = sh(f"srun -N1 -w {node} --immediate={JOB_TIMEOUT_S} printenv SLURMD_NODENAME",
             JOB_TIMEOUT_S)
    return job.returncode == 0 and node in job.stdout.split()


def without_gpus_settings() -> str:
    """Lines appended to a node's prolog settings: the default for jobs without GPUs (auto:
    skipped, since slurm.conf's GresTypes names gpu) and a gdrprobe that marks each run."""
    return f"GDRPROBE={shlex.quote(MARKING_GDRPROBE)}\nGDRPROBE_JOB_WITHOUT_GPUS=auto\n"


def left_alone(node: str) -> bool:
    """A job given no GPU on `node` starts without a check: gdrprobe never ran, the node
    stays up, and the prolog's log says why."""
    with_prolog_settings(without_gpus_settings())
    started = job_ran_on(node)
    drained = sh(f"sinfo -R -h -n {node} -o {shlex.quote(SINFO_REASONS)}", 60)
    return (started and not os.path.exists(MARK) and not drained.stdout.strip()
            and "has no GPU on this node (SLURM_JOB_GPUS unset): nothing to check"
            in tail(PROLOG_LOG, 5))


def refused_on(node: str, settings: str, reason: str) -> bool:
    """A job on `node` under these prolog settings is refused, and the node drains with a
    reason that starts with `reason` (then resumed for the next case)."""
    with_prolog_settings(settings)
    refused = not job_ran_on(node)
    drained = sh(f"sinfo -R -h -n {node} -o {shlex.quote(SINFO_REASONS)}", 60)
    sh(f"scontrol update nodename={node} state=resume", 60)
    return refused and any(
        line.split(None, 2)[2:] and line.split(None, 2)[2].startswith(reason)
        for line in drained.stdout.splitlines())


def write_script(path: str, body: str) -> None:
    with open(path, "w") as script:
        script.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)


def operator_cases() -> dict[str, bool]:
    """On host a (whose prolog settings this process can change): a job given no GPU is
    left alone; a check stuck past the prolog's own limit is killed and drains with that
    reason; a gdrprobe that is not installed, in strict mode, drains as a configuration
    error and sets the metric."""
    write_script(STUCK_GDRPROBE, "exec sleep 600")
    write_script(MARKING_GDRPROBE, f"touch {shlex.quote(MARK)}; exit 1")
    try:
        alone = left_alone(CONTROLLER)
        stuck = refused_on(CONTROLLER, stuck_settings(),
                           f"gdrprobe: check stuck past {STUCK_LIMIT_S} s")
        cannot = refused_on(CONTROLLER, misconfigured_settings(),
                            "gdrprobe cannot check: exit 127")
    finally:
        with_prolog_settings("")
    metric = tail(os.path.join(TEXTFILE_DIR, "gdrprobe_prolog.prom"))
    print(metric)
    return {
        "a job given no GPU started on host a without a check of the node's GPUs": alone,
        "a stuck check was killed by the prolog's limit and drained host a": stuck,
        "a missing gdrprobe drained host a in strict mode (sinfo -R)": cannot,
        "and set gdrprobe_prolog_cannot_check": 'gdrprobe_prolog_cannot_check{check="prolog"} 1'
        in metric,
    }


def sh(command: str, timeout: float) -> subprocess.CompletedProcess:
    """Run a shell command line, print it and what it printed; a hung one is an error."""
    print(f"$ {command}", flush=True)
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise LabError(f"{command!r} did not end in {timeout:.0f} s: {expired.output}") from None
    print((done.stdout + done.stderr).rstrip(), f"\n(exit {done.returncode})", flush=True)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.slurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    node = sub.add_parser("node", help="munged and slurmd until the cluster shuts down")
    node.add_argument("run_dir")
    node.add_argument("name", choices=sorted(NODES))
    demo_parser = sub.add_parser("demo", help="the cluster up, the demo's jobs, the cluster down")
    demo_parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    try:
        if args.action == "node":
            return serve_node(args.run_dir, args.name)
        return run_controller(args.run_dir, demo)
    except LabError as error:
        print(f"lab.slurm: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
