"""deploy/slurm/gdrprobe-prolog.sh run as slurmd runs it, over fakes of what it calls: a
`gdrprobe` that exits with a chosen code ($FAKE_CODE), an `scontrol` and an `scancel` that
record their arguments (`scontrol update` in scontrol.args, `scontrol requeue...` in
requeue.args, scancel in scancel.args). A requeue is refused, as slurmctld refuses it for a
job that is not a batch job, where $FAKE_REQUEUE_CODE is not 0."""

from __future__ import annotations

import os
import subprocess
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
PROLOG = os.path.join(REPO, "deploy", "slurm", "gdrprobe-prolog.sh")
HEALTH_CHECK = os.path.join(REPO, "deploy", "slurm", "gdrprobe-healthcheck.sh")
NODE = "node17"
JOB = "42"
MESSAGE = "gdrprobe check: GPUDirect RDMA not engaged on GPU 0000:3b:00.0 via mlx5_1"
NOT_A_BATCH_JOB = "scontrol: error: Requeue job failed: Only batch jobs are accepted or processed"


def executable(path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    path.chmod(0o755)
    return str(path)


def read(path) -> str:
    return path.read_text() if path.exists() else ""


class PrologNode:
    """A scratch directory with the fakes and a settings file; calling it runs the prolog
    with gdrprobe exiting `code`."""

    def __init__(self, directory):
        self.dir = directory
        self.bin = directory / "bin"
        self.bin.mkdir()
        executable(self.bin / "gdrprobe", f"""\
            #!/bin/sh
            echo "$@" >> {directory}/gdrprobe.args
            echo "${{SLURM_JOB_GPUS-unset}}" >> {directory}/gdrprobe.gpus
            echo "this goes to stdout, which the prolog drops"
            [ "$FAKE_CODE" = 0 ] || {{ echo "{MESSAGE}"; echo "a second line"; }} >&2
            exit "$FAKE_CODE"
            """)
        executable(self.bin / "scontrol", f"""\
            #!/bin/sh
            case $1 in
                requeue*) echo "$@" >> {directory}/requeue.args
                          [ "${{FAKE_REQUEUE_CODE:-0}}" = 0 ] && exit 0
                          echo "{NOT_A_BATCH_JOB}" >&2
                          exit "$FAKE_REQUEUE_CODE" ;;
            esac
            printf '%s\\n' "$@" >> {directory}/scontrol.args
            exit "${{FAKE_SCONTROL_CODE:-0}}"
            """)
        executable(self.bin / "scancel", f"""\
            #!/bin/sh
            echo "$@" >> {directory}/scancel.args
            exit "${{FAKE_SCANCEL_CODE:-0}}"
            """)
        self.conf = directory / "gdrprobe-prolog"
        (directory / "textfile").mkdir()
        self.conf.write_text(f"GDRPROBE_PROLOG_LOG={directory}/prolog.log\n"
                             f"GDRPROBE_PROLOG_METRICS_DIR={directory}/textfile\n")

    def __call__(self, code: int, script: str = PROLOG, **env: str) -> subprocess.CompletedProcess:
        environment = {"PATH": f"{self.bin}:/usr/bin:/bin", "SLURMD_NODENAME": NODE,
                       "SLURM_JOB_ID": JOB, "GDRPROBE_PROLOG_CONF": str(self.conf),
                       "SLURM_CONF": str(self.dir / "slurm.conf"),
                       "FAKE_CODE": str(code), **env}
        return subprocess.run(["sh", script], env=environment, capture_output=True,
                              text=True, timeout=30)

    def settings(self, *lines: str) -> None:
        """Lines appended to the settings file."""
        with self.conf.open("a") as conf:
            conf.write("".join(f"{line}\n" for line in lines))

    def log(self) -> str:
        return read(self.dir / "prolog.log")

    def drained(self) -> list[str]:
        """scontrol update's arguments, one a line."""
        return read(self.dir / "scontrol.args").splitlines()

    def reason(self) -> str:
        """The last drain reason given to scontrol ("" where none)."""
        return next((line.removeprefix("reason=") for line in reversed(self.drained())
                     if line.startswith("reason=")), "")

    def requeued(self) -> list[str]:
        return read(self.dir / "requeue.args").splitlines()

    def cancelled(self) -> list[str]:
        return read(self.dir / "scancel.args").splitlines()

    def checked(self) -> list[str]:
        """The arguments gdrprobe was run with, one run a line."""
        return read(self.dir / "gdrprobe.args").splitlines()

    def metrics(self, kind: str = "prolog") -> dict[str, str]:
        """The textfile's samples by metric name (each labelled check="KIND")."""
        found = {}
        text = (self.dir / "textfile" / f"gdrprobe_{kind}.prom").read_text()
        for line in text.splitlines():
            if not line.startswith("#"):
                name, value = line.split(" ")
                metric, labels = name.split("{")
                assert labels == f'check="{kind}"}}'
                found[metric] = value
        return found
