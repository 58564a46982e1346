"""Errors a person sees, each with its cause, its fix and a documented exit code.

Exceptions are for situations the run cannot continue from; the CLI turns them into
one message and the exit code below. The README's "Exit codes" table mirrors this.
"""

from __future__ import annotations

import enum


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
    INTERRUPTED = 130        # Ctrl-C


# What a prolog does with each exit code of 'gdrprobe check': drain for what is wrong with
# this node (GPUDirect not engaged or degraded, the NIC missing or down, verbs or
# completions failing, corrupt payloads, memlock too low); warn for what is wrong with the
# check itself or says nothing about the node (usage, a missing Python dependency, a peer,
# no GPU to test, Ctrl-C). The README's table and the prolog recipe in docs/check.md are
# tested against it.
DRAIN_CODES = (ExitCode.VERDICT_NOT_OK, ExitCode.NO_DEVICE, ExitCode.RDMA, ExitCode.INTEGRITY,
               ExitCode.RESOURCE_LIMIT)
SCHEDULER_ACTION = {int(code): ("start the job" if code == ExitCode.OK else
                                "drain" if code in DRAIN_CODES else "warn")
                    for code in ExitCode}


class GdrprobeError(Exception):
    """Base of every error that reaches a person: cause, evidence and fix."""

    exit_code: ExitCode = ExitCode.RDMA

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
        return "\n  ".join(parts)


class VerdictNotOk(GdrprobeError):
    """The probe ran and GPUDirect RDMA is degraded or not engaged."""

    exit_code = ExitCode.VERDICT_NOT_OK


class UsageError(GdrprobeError):
    exit_code = ExitCode.USAGE


class MissingDependency(GdrprobeError):
    exit_code = ExitCode.MISSING_DEPENDENCY


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


class CudaError(GdrprobeError):
    """A CUDA driver call failed; alone it stops a run as a failed verbs call does."""

    exit_code = ExitCode.RDMA


class IntegrityError(GdrprobeError):
    exit_code = ExitCode.INTEGRITY


class ResourceLimit(GdrprobeError):
    exit_code = ExitCode.RESOURCE_LIMIT


class NotTestable(GdrprobeError):
    exit_code = ExitCode.NOT_TESTABLE


class Interrupted(GdrprobeError):
    exit_code = ExitCode.INTERRUPTED


# Errors a server reports to its client keep their class across the wire, so a client
# sees "not testable" or "registration failed" as such, not as a generic peer error.
WIRE_ERRORS = {cls.__name__: cls for cls in (NotTestable, RegistrationFailed, ResourceLimit,
                                             MissingDependency, NoDevice, IntegrityError,
                                             CudaError, CompletionError)}
