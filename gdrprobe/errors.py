"""Errors a person sees, each with its cause, its fix and a documented exit code.

Exceptions are for situations the run cannot continue from; the CLI turns them into
one message and the exit code below. :data:`EXIT_CODES` is the one table of exit codes:
the README's "Exit codes" table, ``gdrprobe check --help`` and the prolog recipe in
docs/check.md are generated from it or tested against it.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import shlex
import sys
import unicodedata


class ExitCode(enum.IntEnum):
    OK = 0
    VERDICT_NOT_OK = 1       # the probe ran; the answer is "degraded" or "not engaged"
    USAGE = 2                # bad flags or arguments (argparse uses 2 too)
    MISSING_DEPENDENCY = 3   # pyverbs or cuda-python absent (no CUDA driver: NOT_TESTABLE)
    NO_DEVICE = 4            # no RDMA device, unknown device name, no usable port/GID
    PEER = 5                 # out-of-band channel: refused, bad token, time-out, bad message
    RDMA = 6                 # a verbs call or a work completion failed
    INTEGRITY = 7            # payload verification found corrupt bytes
    RESOURCE_LIMIT = 8       # memlock, hugepages, out of memory
    NOT_TESTABLE = 9         # a requested arm cannot run here (no GPU, no CUDA driver)
    NCCL_SETTING = 10        # an NCCL setting keeps NCCL off GPUDirect RDMA; the node is fine
    GPU_UNUSABLE = 11        # every CUDA process fails on this GPU (fabric manager down, ...)
    INCONCLUSIVE = 12        # no answer now: the measurement straddles, or another job is busy
    PERFORMANCE_WARNING = 13  # engaged, but rails contend, latency or GPU-memory reads fall short
    INTERNAL = 70            # a bug in gdrprobe: sysexits.h's EX_SOFTWARE, "internal software error"
    INTERRUPTED = 130        # Ctrl-C: SIGINT, 128 + 2 as a shell reports it
    BROKEN_PIPE = 141        # the output's reader went away: SIGPIPE, 128 + 13
    TERMINATED = 143         # SIGTERM (a scheduler, kill): 128 + 15


@dataclasses.dataclass(frozen=True)
class ExitCodeRow:
    code: ExitCode
    meaning: str
    action: str      # what a scheduler's prolog does: start the job, drain or warn


START, DRAIN, WARN = "start the job", "drain", "warn"

# The one table of exit codes and what a prolog does with each. Drain for what is wrong with
# this node and would fail or slow the job (GPUDirect not engaged or degraded, the NIC
# missing, down or unopenable, verbs or completions failing, corrupt payloads, memlock too
# low, a GPU that no CUDA process can use); warn for what is wrong with the check itself or
# says nothing about the node (usage, a missing Python dependency, a peer, no GPU to test,
# an NCCL setting of the job, a bug in gdrprobe, Ctrl-C), and for performance answers past
# one-way WRITE (the platform's design: every node of the build repeats it, no drain repairs
# it, and no hardware has calibrated the bounds yet).
EXIT_CODES = (
    ExitCodeRow(ExitCode.OK, "engaged; for other commands: success", START),
    ExitCodeRow(ExitCode.VERDICT_NOT_OK,
                "the probe ran and the answer is not OK: GPUDirect RDMA degraded or not "
                "engaged; the doctor found a failing check; `nccl-log` saw network channels "
                "and none used GDRDMA, or GDR off on every NIC; `bench --baseline` found a row "
                "that fell; `cluster` found a slow pair; `check --gin`: the job asked for GIN "
                "explicitly (NCCL_GIN_ENABLE=1, NCCL_GIN_TYPE, NVSHMEM_IB_ENABLE_IBGDA=1) and this node "
                "cannot give it GPU-initiated (the driver refused to map the NIC's doorbell, or NCCL's "
                "rules keep GIN off on this node)", DRAIN),
    ExitCodeRow(ExitCode.USAGE, "bad flags or arguments (an unreadable, empty or binary NCCL "
                "log, a time budget too small for one run, an output path where something other "
                "than a regular file stands, a damaged capture under `--root`: the file named)",
                WARN),
    ExitCodeRow(ExitCode.MISSING_DEPENDENCY, "a Python dependency is missing (pyverbs, "
                "cuda-python; mpi4py, matplotlib or prometheus_client where their output is "
                "asked for)", WARN),
    ExitCodeRow(ExitCode.NO_DEVICE, "no RDMA device (under a GPU arm: 9, unless an RDMA NIC "
                "is on the PCI bus without its RDMA driver), unknown device name, a device "
                "that cannot be opened, port not ACTIVE, no usable GID", DRAIN),
    ExitCodeRow(ExitCode.PEER, "the peer: cannot connect, wrong token, time-out, bad or "
                "tampered message, peer went away", WARN),
    ExitCodeRow(ExitCode.RDMA, "a verbs call or a work completion failed", DRAIN),
    ExitCodeRow(ExitCode.INTEGRITY, "payload corruption", DRAIN),
    ExitCodeRow(ExitCode.RESOURCE_LIMIT, "a resource limit: locked memory, huge pages, host "
                "memory", DRAIN),
    ExitCodeRow(ExitCode.NOT_TESTABLE, "not testable here (no GPU, no CUDA driver, no RDMA "
                "device under a GPU arm, memory that proves nothing, CUDA out of memory, a "
                "pyverbs build gdrprobe cannot use; an NCCL log whose network lines could not "
                "be read)", WARN),
    ExitCodeRow(ExitCode.NCCL_SETTING, "NCCL will not use GPUDirect RDMA for this GPU because "
                "of an NCCL setting (the job's environment or an NCCL configuration file, e.g. "
                "`NCCL_NET_GDR_LEVEL=LOC`); the node is fine. Where NCCL's rules refuse it on "
                "this node's hardware or stack, the exit is 1. `check --gin`: the job asked for GIN and "
                "a setting of its own keeps GIN off (NCCL_CUMEM_ENABLE=0, NCCL_GIN_ENABLE=0, an older NCCL)",
                WARN),
    ExitCodeRow(ExitCode.GPU_UNUSABLE, "the GPU is unusable for every CUDA process: the "
                "fabric manager is not running, forward-compatibility libraries the GPU does "
                "not support, driver library and kernel module differ, another process holds "
                "the GPU in exclusive-process mode, an uncorrectable ECC or NVLink error, a "
                "GPU sysfs lists that CUDA does not (fallen off the bus, a broken driver)",
                DRAIN),
    ExitCodeRow(ExitCode.INCONCLUSIVE, "inconclusive: the node could not be judged now (the "
                "per-repeat ratios still straddle the threshold at the end of the time budget, "
                "another job's traffic on the NIC during the window, or a GPU or NIC held by a "
                "process that is not the job's); it says nothing against the node", WARN),
    ExitCodeRow(ExitCode.PERFORMANCE_WARNING, "engaged, but a performance answer the check "
                "was asked for falls short: rails that contend (`check --all-rails`: every rail "
                "engaged alone, but together some keep less than `defaults.RAIL_RATIO` of their "
                "solo bandwidth; the report names the PCIe element, root complex or socket they "
                "share), latency degraded (`--latency`: the GPU memory's small-message latency "
                "over the host memory's by more than --latency-factor) or GDR read degraded "
                "(`--read`, `--bidir`: WRITEs out of GPU memory into host memory, the NIC "
                "reading it as NCCL's sends do, or both ends WRITEing at once, below the "
                "threshold while GPU memory at both ends passes; NCCL's mitigation: "
                "NCCL_NET_GDR_READ=0) or GIN CPU-proxied (`--gin`: the driver refused to map the "
                "NIC's doorbell for the GPU, and the job did not ask for GIN explicitly). "
                "Facts of the platform's design that every node of the build repeats and no drain "
                "repairs, with bounds no hardware has calibrated yet: reported and alerted "
                "(GdrprobeRailContention), never a drain", WARN),
    ExitCodeRow(ExitCode.INTERNAL, "an internal error: a bug in gdrprobe (the message says "
                "where, and how to report it); it says nothing about the node", WARN),
    ExitCodeRow(ExitCode.INTERRUPTED, "interrupted (Ctrl-C: SIGINT); everything was "
                "released", WARN),
    ExitCodeRow(ExitCode.BROKEN_PIPE, "the reader of the output went away (a closed pipe: "
                "output piped into `head` or `true`): the command stopped quietly, as a Unix "
                "tool that SIGPIPE ends; it says nothing about the node", WARN),
    ExitCodeRow(ExitCode.TERMINATED, "terminated (SIGTERM: a scheduler, `kill`, a container "
                "stopping); everything was released", WARN),
)
SCHEDULER_ACTION = {int(row.code): row.action for row in EXIT_CODES}
DRAIN_CODES = tuple(row.code for row in EXIT_CODES if row.action == DRAIN)
# The warnings that say the check itself could not run (bad flags, a missing Python
# dependency, a bug in gdrprobe): nothing against the node, but nothing checks it either
# until an operator acts; deploy/ makes them seen (NPD's GdrprobeCheckProblem condition, the
# alert GdrprobeCheckCannotRun), never silent.
CANNOT_CHECK_CODES = (ExitCode.USAGE, ExitCode.MISSING_DEPENDENCY, ExitCode.INTERNAL)


def severity(code: int) -> tuple[int, int]:
    """How much an exit code weighs for a scheduler: a drain over a warn over a start (an
    unknown code warns), then the higher code."""
    action = SCHEDULER_ACTION.get(code, WARN)
    return ({START: 0, WARN: 1, DRAIN: 2}[action], code)


def worst_exit_code(codes, default: int = 0) -> int:
    """The code a set of answers gives a scheduler: the most severe (a drain before a warn,
    so that one pair's peer error never hides another pair's fault)."""
    return max(codes, key=severity, default=default)


def exit_codes_markdown() -> str:
    """The README's "Exit codes" table, as generated from :data:`EXIT_CODES`."""
    lines = ["| exit | meaning | prolog action |", "|---|---|---|"]
    lines += [f"| {int(row.code)} | {row.meaning} | {row.action} |" for row in EXIT_CODES]
    return "\n".join(lines)


def exit_codes_epilog() -> str:
    """What each exit code tells a scheduler, for a command's --help."""
    actions = {action: [str(int(row.code)) for row in EXIT_CODES if row.action == action]
               for action in (START, DRAIN, WARN)}
    return ("exit codes: " + "; ".join(f"{', '.join(codes)}: {action}"
                                       for action, codes in actions.items())
            + " (the README's 'Exit codes' table says what each one means)")


def errno_label(code: int | None) -> str:
    """An errno as verbs tools and NCCL's messages print it: EOPNOTSUPP for 95 (Python's
    first name for it is the alias ENOTSUP)."""
    if code == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"
    return errno.errorcode.get(code, f"errno {code}")


QUOTED_CHARS = 64      # of a person's or a machine's input, quoted back in a message


def quoted(text: str, limit: int = QUOTED_CHARS) -> str:
    """Input a message quotes back (a variable's value, a flag's argument) as ``repr`` shows
    it, every control, separator or unassigned character escaped, and cut to ``limit``
    characters with its length said: a 100 KB variable is never echoed whole."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def cut(text: str, limit: int = QUOTED_CHARS) -> str:
    """Input a report repeats, unquoted: :func:`printable`, and at most ``limit`` characters
    with its length said."""
    if len(text) <= limit:
        return printable(text)
    return f"{printable(text[:limit])}... ({len(text)} characters)"


def printable(text: str) -> str:
    """Text for a terminal line, a log or a scheduler's drain reason: every control, format,
    private-use, surrogate or unassigned character (Unicode categories C*: U+FFFE, ESC,
    bidirectional overrides) and the line and paragraph separators U+2028 and U+2029 as
    ``?``; the line breaks a message is made of stay."""
    return "".join(ch if ch == "\n" or not is_hidden(ch) else "?" for ch in text)


def is_hidden(ch: str) -> bool:
    """Whether a character could forge a line or hide text: categories C* and the line
    and paragraph separators (Zl, Zp), which some terminals and log readers take for a
    new line."""
    category = unicodedata.category(ch)
    return category[0] == "C" or category in ("Zl", "Zp")


class GdrprobeError(Exception):
    """Base of every error that reaches a person: cause, evidence and fix. Each class below
    names its exit code; one raised without a class of its own is a bug in gdrprobe, so the
    base's is the internal error's (a warn), never a drain."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, cause: str, fix: str = "", evidence: str = ""):
        super().__init__(cause)
        self.cause = cause
        self.fix = fix
        self.evidence = evidence

    def __str__(self) -> str:
        parts = [self.cause]
        if self.evidence:
            parts.append(f"evidence: {self.evidence}")
        if self.fix:
            parts.append(f"fix: {self.fix}")
        return printable("\n  ".join(parts))


class VerdictNotOk(GdrprobeError):
    """The probe ran and GPUDirect RDMA is degraded or not engaged."""

    exit_code = ExitCode.VERDICT_NOT_OK


class UsageError(GdrprobeError):
    exit_code = ExitCode.USAGE


class MissingDependency(GdrprobeError):
    exit_code = ExitCode.MISSING_DEPENDENCY


# The optional extras a user installs (pyproject.toml's [project.optional-dependencies], less
# the developers' test and lab): the distribution each adds, and the Debian 12 (and Ubuntu)
# package that provides it where there is one at the extra's version rule (docs/install.md).
EXTRAS = {"nvml": ("nvidia-ml-py", None),
          "rocm": ("hip-python", None),
          "plot": ("matplotlib", "python3-matplotlib"),
          "prometheus": ("prometheus-client", "python3-prometheus-client"),
          "progress": ("tqdm", "python3-tqdm")}


def pip_install(requirement: str) -> str:
    """The command that installs `requirement` for the Python gdrprobe runs on: its own
    interpreter's pip (a bare `pip` may be another Python's, or none at all)."""
    return f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(requirement)}"


def extra_fix(extra: str) -> str:
    """How to install an optional extra: this interpreter's pip, or the distribution's
    package where it has one (a system Python that refuses pip, PEP 668)."""
    distribution, debian = EXTRAS[extra]
    fix = f"{pip_install(f'gdrprobe[{extra}]')} ({distribution})"
    return fix + (f", or the distribution's package (Debian, Ubuntu): apt-get install {debian}"
                  if debian else "")


class NoDevice(GdrprobeError):
    exit_code = ExitCode.NO_DEVICE


class NoRdmaDevice(NoDevice):
    """Not one RDMA device here: under a GPU arm the A/B is "not testable" (exit 9)."""


class PeerError(GdrprobeError):
    exit_code = ExitCode.PEER


class RdmaError(GdrprobeError):
    exit_code = ExitCode.RDMA


class RegistrationFailed(RdmaError):
    """The NIC driver refused to register (GPU) memory; ``error_code`` is the errno."""

    def __init__(self, cause: str, fix: str = "", evidence: str = "", error_code: int = -1,
                 mechanism: str = ""):
        super().__init__(cause, fix, evidence)
        self.error_code = error_code
        self.mechanism = mechanism


class CompletionError(RdmaError):
    """A work completion came back with an error status (the loop's QP is then in error);
    ``wc_status`` is the ibv_wc_status, -1 where unknown (a peer's report)."""

    def __init__(self, cause: str, fix: str = "", evidence: str = "", wc_status: int = -1):
        super().__init__(cause, fix, evidence)
        self.wc_status = wc_status


class GpuRuntimeError(GdrprobeError):
    """A GPU runtime's call failed (the CUDA driver's, HIP's): the one base of every
    runtime's error (gdrprobe.memory.runtime); alone it stops a run as a failed verbs call
    does, and in the A/B it ends the GPU arm, not the check."""

    exit_code = ExitCode.RDMA


class CudaError(GpuRuntimeError):
    """A CUDA driver call failed."""


class HipError(GpuRuntimeError):
    """A HIP runtime call failed (an AMD GPU)."""


class IntegrityError(GdrprobeError):
    exit_code = ExitCode.INTEGRITY


class ResourceLimit(GdrprobeError):
    exit_code = ExitCode.RESOURCE_LIMIT


class NotTestable(GdrprobeError):
    exit_code = ExitCode.NOT_TESTABLE


class NcclSetting(GdrprobeError):
    """An NCCL setting keeps NCCL off GPUDirect RDMA for this GPU (require())."""

    exit_code = ExitCode.NCCL_SETTING


class GpuOutOfMemory(NotTestable):
    """CUDA is out of memory: other processes hold the GPU's memory (in a training job, the
    job itself may), so the check cannot run, and that says nothing against the node."""


class GpuUnusable(GdrprobeError):
    """The GPU or the CUDA system fails every CUDA process on this node: a job started here
    crashes as the check did (:mod:`gdrprobe.memory.cuda_results` says which results)."""

    exit_code = ExitCode.GPU_UNUSABLE


class Inconclusive(GdrprobeError):
    """The node could not be judged now: the answer depends on something that is not the
    node's fault (another job's traffic or process, a measurement that straddles)."""

    exit_code = ExitCode.INCONCLUSIVE


class Interrupted(GdrprobeError):
    exit_code = ExitCode.INTERRUPTED


# Errors a server reports to its client keep their class across the wire, so a client
# sees "not testable" or "registration failed" as such, not as a generic peer error.
WIRE_ERRORS = {cls.__name__: cls for cls in (NotTestable, RegistrationFailed, ResourceLimit,
                                             MissingDependency, NoDevice, IntegrityError,
                                             GpuRuntimeError, CudaError, HipError,
                                             CompletionError, GpuOutOfMemory, GpuUnusable)}
