"""``run()``: one run, or with a GPU buffer at either end the A/B (host arm against GPU arm;
with ``mode="latency"`` the latency A/B), from its plan (:class:`RunPlan`), which the public
API builds from its keywords.

A GPU buffer of this host is registered as NCCL registers that GPU's memory where the
mechanism is left open (``--mem gpu``: :func:`gdrprobe.campaign.machine.follow_nccl`), the
registrations follow ``NCCL_IB_PCI_RELAXED_ORDERING`` as the job's NCCL reads it, and the
runs are fitted to the locked-memory limit (:mod:`gdrprobe.campaign.memlock`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe import defaults
from gdrprobe.campaign import machine, memlock, nccl_pattern
from gdrprobe.campaign.ab import ab_test, no_device_not_testable
from gdrprobe.campaign.arguments import check_latency_a_b
from gdrprobe.campaign.latency_ab import latency_ab
from gdrprobe.campaign.plan import Peer, probe_options
from gdrprobe.errors import NoRdmaDevice, UsageError
from gdrprobe.measure import loopback
from gdrprobe.memory.runtime import require_gpu_library
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma import verbs
from gdrprobe.rdma.endpoint import EndpointOptions

FLUSH_ASKED = "asked for (run --flush)"   # what asked run() for NCCL's flush


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What run() is asked: the memory at each end, the endpoint, the peer, the runs'
    settings (ProbeOptions fields; None: the default) and the A/B's repeats and threshold."""

    local: MemorySpec
    remote: MemorySpec | None                # None: the server's own buffer
    endpoint: EndpointOptions
    peer: Peer
    settings: Mapping[str, object] = dataclasses.field(default_factory=dict)
    size: int | None = None
    repeats: int = defaults.REPEATS
    threshold: float = defaults.THRESHOLD
    staged: bool = False
    connect_wait_s: float = 0.0
    flush: bool = False
    pattern: str | None = None               # "nccl": NCCL's pattern after each stream

    def __post_init__(self):
        if not 0 <= self.connect_wait_s <= 3600:
            raise UsageError("--connect-wait must be 0 to 3600 s",
                             "e.g. --connect-wait 60 for a server that is still starting")

    @property
    def a_b(self) -> bool:
        """A GPU buffer at either end makes the run an A/B."""
        return self.local.kind == "gpu" or (self.remote is not None and self.remote.kind == "gpu")

    @property
    def latency_a_b(self) -> bool:
        return self.a_b and self.settings.get("mode") == "latency"


def run(plan: RunPlan, on_result=None, notice=None):
    """The run, or the A/B: the RunReport, the CheckReport or the LatencyABReport."""
    settings = dict(plan.settings)
    if plan.latency_a_b:   # which end the CPU checks, before a GPU runtime is looked for
        check_latency_a_b(settings.get("opcode", "write"), plan.local, plan.remote)
    if plan.a_b:
        require_gpu_arm(plan.local, plan.remote if plan.peer.loopback else None)
    if plan.flush:
        settings["flush"] = FLUSH_ASKED
    nccl_pattern.check_pattern(plan.pattern, settings)
    # This host's facts where a GPU buffer is here: --mem gpu registers as NCCL does.
    facts = machine.run_facts(plan.local, plan.peer.loopback) if plan.a_b else None
    local = machine.follow_nccl(plan.local, facts)
    remote = (machine.follow_nccl(plan.remote, facts)
              if plan.peer.loopback and plan.remote is not None else plan.remote)
    view = (facts.nccl_environ, facts.nccl_rules) if facts else machine.nccl_view()
    settings, transport = nccl_pattern.pattern_settings(
        plan.pattern, view[0], plan.endpoint.device, plan.endpoint.port, plan.size, settings)
    # The bandwidth A/B's default size is a large message's; latency keeps a run's default.
    large = plan.a_b and not plan.latency_a_b
    options = probe_options(settings, defaults.A_B_SIZE if large else defaults.SIZE,
                            plan.size, view)
    # Both ends pin their buffers here in loopback, the client's alone against a server.
    options = memlock.fit_to_memlock(options, plan.peer.ends_here, memlock.locked_memory(),
                                     notice)
    probe = loopback.runner(options, plan.endpoint, *plan.peer.address, plan.connect_wait_s,
                            on_result=None if plan.a_b else on_result, notice=notice)
    if not plan.a_b:
        return nccl_pattern.answered(probe(local, remote), transport, plan.threshold)
    if plan.latency_a_b:
        return latency_ab(probe, local, remote, plan.repeats)
    return ab_test(probe, local, remote, staged=plan.staged, repeats=plan.repeats,
                   threshold=plan.threshold, doctor_findings=facts.findings if facts else (),
                   opcode=options.opcode, pattern=transport)


def require_gpu_arm(*in_process: MemorySpec | None) -> None:
    """What the A/B needs before its host arm measures anything, so that a machine that
    cannot run the GPU arm answers "not testable" at once with the cause: an RDMA device,
    then, for a GPU buffer in this process, the node's GPU runtime library (found as the
    runtime finds it, without importing its bindings: memory.runtime)."""
    try:
        verbs.devices()
    except NoRdmaDevice as error:
        raise no_device_not_testable(error) from error
    if any(spec is not None and spec.kind == "gpu" for spec in in_process):
        require_gpu_library()
