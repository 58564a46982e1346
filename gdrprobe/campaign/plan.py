"""The check plan: what one ``check()`` or ``check_node()`` call asks, checked and frozen
below the door (docs/ARCHITECTURE.md, "The check plan").

The public API builds a plan from its keywords, one value per concern, each refusing a bad
keyword with its fix when it is made, before the machine is read or anything measured:

- **the runs' options** (:func:`gate_options`): ProbeOptions with check's QPs
  (``defaults.CHECK_QPS``) and the A/B's size, and which of them were given;
- **the memory at each end** (:class:`Buffer`): a ``--mem`` choice and its GPU details, for
  whichever GPU the check pairs (the GPU is named where the pair is known:
  :func:`gdrprobe.campaign.prelaunch.plan_pair`);
- **the endpoint** (:func:`endpoint`): the device where one is given, the port, the GID index;
- **the criteria** (:class:`Criteria`): threshold, floor, repeats, and the extra answers
  asked for with their bounds;
- **the peer** (:class:`Peer`): a server instead of loopback.

What NCCL will do on this node joins the plan once the machine is read
(:func:`on_machine`): the registrations' relaxed ordering (``NCCL_IB_PCI_RELAXED_ORDERING``)
and the GPU memory's allocation (``NCCL_CUMEM_ENABLE``), each unless given.

Adding a criterion: a field of :class:`Criteria` with its check in :meth:`Criteria.asked`,
its keyword in the door. Adding an extra answer: a row of
:data:`gdrprobe.campaign.prelaunch.EXTRA_ANSWERS`, its keyword in the door (passed to
:meth:`Criteria.asked` by name), its field of the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe import defaults
from gdrprobe.campaign import machine, secondary
from gdrprobe.campaign.arguments import (check_endpoint, check_floor, check_host,
                                         check_pattern_name, check_token, check_verdict,
                                         percent_habit)
from gdrprobe.campaign.communicator import Communicator
from gdrprobe.campaign.gate import MachineFacts, check_time_budget
from gdrprobe.errors import UsageError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.rdma.endpoint import EndpointOptions


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One end's memory for any GPU: a --mem choice (host, gpu, dmabuf, peermem, staged) and
    its GPU details; checked when made (:class:`gdrprobe.memory.spec.MemorySpec`)."""

    choice: str = "host"
    memory_type: str = defaults.GPU_MEMORY_TYPE
    allocation: str | None = None      # vmm or malloc; None: as NCCL will (on_machine)
    pcie_mapping: bool = False
    huge_pages: bool = False

    def __post_init__(self):
        self.spec()

    def spec(self, gpu: str = "0") -> MemorySpec:
        """The buffer on one GPU (a bus id or an ordinal)."""
        return MemorySpec.from_choice(self.choice, gpu=gpu, memory_type=self.memory_type,
                                      pcie_mapping=self.pcie_mapping,
                                      huge_pages=self.huge_pages,
                                      allocation=self.allocation or defaults.GPU_ALLOCATION)


@dataclasses.dataclass(frozen=True)
class Peer:
    """Where the other end runs: a server (host, its port, its token), or None: loopback."""

    host: str | None = None
    port: int = defaults.PORT
    token: str | None = None

    @property
    def loopback(self) -> bool:
        return self.host is None

    @property
    def address(self) -> tuple[str | None, int, str | None]:
        """(host, port, token) as the run engine takes them (measure.loopback.runner)."""
        return self.host, self.port, self.token

    @property
    def ends_here(self) -> int:
        """The buffers this process pins per run: both ends in loopback, else its own."""
        return 2 if self.loopback else 1


def tcp_port(port: int | None) -> int:
    """The server's TCP port: as given, else the default."""
    return defaults.PORT if port is None else port


def peer(host: str | None, port: int | None, token: str | None) -> Peer:
    """A server to measure against (its token required), or loopback where host is None."""
    if host is None:
        return Peer(port=tcp_port(port))
    check_host(host)
    check_token(token, required=True)
    return Peer(host, tcp_port(port), token)


def endpoint(device: str | None, ib_port: int, gid_index: int | None) -> EndpointOptions:
    """The RDMA endpoint asked for: the device (None: chosen), the port, the GID index."""
    check_endpoint(ib_port, gid_index)
    return EndpointOptions(device=device, port=ib_port, gid_index=gid_index)


@dataclasses.dataclass(frozen=True)
class Criteria:
    """What an answer is judged by: the A/B's threshold, repeats and line-rate floor, and the
    extra answers asked for (by name, :data:`gdrprobe.campaign.prelaunch.EXTRA_ANSWERS`)
    with the latency A/B's bound."""

    threshold: float = defaults.THRESHOLD
    floor: float = defaults.FLOOR
    repeats: int = defaults.REPEATS
    answers: tuple[str, ...] = ()
    latency_factor: float = defaults.LATENCY_FACTOR
    latency_factor_source: str = secondary.DEFAULT_FACTOR_SOURCE

    def asks(self, answer: str) -> bool:
        return answer in self.answers

    @classmethod
    def asked(cls, *, threshold: float, floor: float, repeats: int,
              latency_factor: float | None = None, **answers: bool) -> Criteria:
        """From the door's keywords, each refused with its fix; answers: each extra answer's
        keyword (latency=True, read=False, ...)."""
        if latency_factor is not None:
            secondary.check_latency_factor(latency_factor, answers.get("latency", False))
        check_pattern_name(answers.get("pattern"))
        check_verdict(threshold, repeats)
        percent_habit("--floor", floor)
        check_floor(floor)
        bound = {} if latency_factor is None else {
            "latency_factor": latency_factor,
            "latency_factor_source": f"as given (latency_factor={latency_factor:g})"}
        return cls(threshold, floor, repeats, tuple(name for name, on in answers.items() if on),
                   **bound)


def given(settings: Mapping[str, object]) -> dict[str, object]:
    """The settings given (an argument left at None takes the default)."""
    return {key: value for key, value in settings.items() if value is not None}


def probe_options(settings: Mapping[str, object], default_size: int, size: int | None = None,
                  nccl_view: tuple[Mapping[str, str], NcclRules] | None = None) -> ProbeOptions:
    """A run's options: the settings given (ProbeOptions fields), at `size` (else
    default_size) unless sizes are given; registration with NCCL_IB_PCI_RELAXED_ORDERING as
    the job's NCCL reads it (nccl_view: the environment as NCCL sees it and its release's
    rules) unless relaxed_ordering is given; the rest is ProbeOptions' own (defaults)."""
    chosen = given(settings)
    if "sizes" not in chosen:
        chosen["sizes"] = (default_size if size is None else size,)
    if "relaxed_ordering" not in chosen and nccl_view is not None:
        environ, rules = nccl_view
        chosen["relaxed_ordering"] = rules.relaxed_ordering(environ)
    return ProbeOptions(**chosen)


def gate_options(size: int | None, settings: Mapping[str, object]) -> tuple[ProbeOptions, frozenset]:
    """A check's options (bandwidth at the A/B's size, CHECK_QPS QPs) and which were given."""
    if settings.get("mode", "bandwidth") != "bandwidth":
        raise UsageError("check() compares bandwidth; latency runs use host memory",
                         "drop mode='latency' (latency: run() with host memory)")
    chosen = {"qps": defaults.CHECK_QPS, **given(settings)}
    return probe_options(chosen, defaults.A_B_SIZE, size), frozenset(given(settings))


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """What a check is asked, the same for every GPU of a node check; frozen."""

    options: ProbeOptions                      # the runs', before sizing to the budget
    send: Buffer                               # the memory the NIC reads, for any GPU
    receive: Buffer                            # the memory the NIC writes (a server's)
    criteria: Criteria = Criteria()
    endpoint: EndpointOptions = EndpointOptions()   # device: as given (None: NCCL's choice)
    peer: Peer = Peer()
    given: frozenset = frozenset()             # the options given (not perftest's rules)
    staged: bool = False
    time_budget_s: float | None = defaults.CHECK_TIME_BUDGET_S
    # The GPUs (bus ids) that another process holding is a fault of: in a node check, the
    # job's, which no process of the job holds yet; None in a rank's check (the job runs,
    # and its other ranks may hold theirs): the checked GPU alone.
    job_gpus: tuple[str, ...] | None = None

    def __post_init__(self):
        check_time_budget(self.time_budget_s)

    @property
    def keep_cq_moderation(self) -> bool:
        return "cq_moderation" in self.given


def on_machine(plan: CheckPlan, facts: MachineFacts) -> CheckPlan:
    """The plan as NCCL will run on this machine: NCCL's relaxed-ordering setting for the
    registrations and NCCL's allocation for the GPU memory (NCCL_CUMEM_ENABLE), each unless
    given, from the environment as NCCL sees it (configuration files included)."""
    environ, rules = facts.nccl_environ, facts.nccl_rules
    options = plan.options
    if "relaxed_ordering" not in plan.given:
        options = dataclasses.replace(options, relaxed_ordering=rules.relaxed_ordering(environ))
    allocation = rules.gpu_allocation(environ)
    return dataclasses.replace(plan, options=options,
                               send=_allocated(plan.send, allocation),
                               receive=_allocated(plan.receive, allocation))


def _allocated(buffer: Buffer, allocation: str) -> Buffer:
    return buffer if buffer.allocation else dataclasses.replace(buffer, allocation=allocation)


def read_machine(plan: CheckPlan, job: Communicator | None = None) -> tuple[MachineFacts, CheckPlan]:
    """The machine read once for a check (one doctor, one GPU-runtime start-up; job: the GPUs
    of NCCL's communicator on this node, matched there), GPUs the PCI bus holds that the GPU
    runtime lost refused (GpuUnusable, exit 11: every job here meets it), and the plan there."""
    facts = machine.machine_facts(job=job)
    machine.require_gpus(facts)
    return facts, on_machine(plan, facts)
