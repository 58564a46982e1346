"""What NCCL will do for each GPU, and the NCCL variables that disable or restrict GPUDirect RDMA.

``nccl.gpu.<bdf>`` is the per-GPU decision of :mod:`gdrprobe.nccl.decision` (the NIC,
the path, GDR for receives and sends, why). The variable checks follow NCCL 2.30.7's source
(NVIDIA/nccl, src/graph/paths.cc, src/misc/param.cc, src/transport/net_ib): variables are
read with strtoll base 0 (so ``0x1`` is 1 and ``08`` is 0) and NCCL_NET_GDR_LEVEL is
matched case-sensitively, an unknown spelling silently ignored, so both are parsed here
exactly as NCCL parses them (:mod:`gdrprobe.nccl.env`).

``nccl.data_direct``: libmlx5 gives a NIC a data-direct device (the rules:
:mod:`gdrprobe.nccl.data_direct`) and NCCL does not use it: the release predates it,
NCCL_IB_DATA_DIRECT turns it off, or NCCL picks another device for every GPU; or a lookup
error stops NCCL's IB transport (2.28.3 on). OK where every data-direct device carries a
GPU's traffic.

``nccl.gpu.<bdf>.data_direct_domain``: a GPU's data-direct device is in another PCI domain
than the GPU. The data-direct device writes GPU memory over PCIe within the GPU's own
domain; across domains the traffic leaves that path, and Meta reports data-direct
registration succeeding only on domain-matched NICs (meta-pytorch/torchcomms PR 3104).
"""

from __future__ import annotations

import dataclasses
import functools

from gdrprobe.doctor.facts import nvml
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.nccl import data_direct, effects, params
from gdrprobe.nccl.decision import SOCKET_PATH, decide
from gdrprobe.nccl.refusals import level_refusal
from gdrprobe.nccl.env import GdrLevel, netdevs_policy, parse_hca_filter
from gdrprobe.nccl.flush import data_direct_net
from gdrprobe.nccl.gdr_support import dmabuf_enabled
from gdrprobe.nccl.topo import nccl_ports
from gdrprobe.nccl.versions import MODELLED, dotted
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, NcclGpuDecision, NcclLibrary, Status

GROUP = ids.NCCL
finding = functools.partial(Finding, group=GROUP)


@dataclasses.dataclass(frozen=True)
class Words:
    """How the doctor says one effect (:mod:`gdrprobe.nccl.effects`)."""

    status: Status
    effect: str           # after "NAME=value: "; {detail} takes the effect's release words
    fix: str = ""


UNSET_FIX = "Unset it unless you are deliberately A/B testing."
NO_EFFECT_FIX = "Unset it: it changes nothing for this NCCL."
WORDS = {
    effects.IB_OFF: Words(Status.FAIL, "NCCL will not use InfiniBand/RoCE verbs and falls back to TCP sockets "
                                       "through host memory: no GPUDirect RDMA", UNSET_FIX),
    effects.SEND_GDR_OFF: Words(Status.WARN, "NCCL will not let the NIC read GPU memory on the send side: sends "
                                             "stage through host memory, receives can still use GPUDirect RDMA",
                                UNSET_FIX),
    effects.SEND_GDR_FORCED: Words(Status.INFO, "NCCL lets the NIC read GPU memory on sends on every GPU, also "
                                                "where its default would not ({detail})"),
    effects.C2C_GDR_OFF: Words(Status.WARN, "NCCL turns GPUDirect RDMA off for the NICs a C2C GPU (Grace) reaches "
                                            "through its CPU{detail}", UNSET_FIX),
    effects.FLUSH_OFF: Words(Status.WARN, "NCCL skips the flush that makes NIC writes visible to the GPU before "
                                          "sm90: received data may be stale", UNSET_FIX),
    # What the file does to NCCL's placement (and where it cannot be read) is the finding
    # topology.nccl_file's, which judges the file itself: this one only says it is set.
    effects.TOPO_FILE: Words(Status.INFO, "NCCL places the GPUs and NICs this file names under the file's "
                                          "switches and CPUs, the rest as it detects them (finding "
                                          "topology.nccl_file: how this file places this node's devices)"),
    effects.PXN_OFF: Words(Status.INFO, "NCCL will not relay through an NVLink peer GPU to that GPU's nearer NIC, "
                                        "so some GPUs use a farther NIC"),
    effects.RELAXED_ORDERING_OFF: Words(Status.INFO, "NCCL registers memory without PCIe relaxed ordering (only 1 "
                                                     "and 2 ask for it), which costs bandwidth in virtual machines"),
    effects.GDRCOPY: Words(Status.INFO, "GDRCopy is a CPU-side copy mechanism; it neither enables nor disables "
                                        "GPUDirect RDMA to the NIC"),
    effects.NOT_READ: Words(Status.INFO, "no effect: {detail}", NO_EFFECT_FIX),
    effects.THE_DEFAULT: Words(Status.INFO, "no effect: {detail}"),
    effects.NOT_HERE: Words(Status.INFO, "no effect here: {detail}"),
}
# The variables no release since 2.4.0 reads, and what replaced them.
REMOVED_WORDS = {
    params.IB_CUDA_SUPPORT.name: Words(Status.WARN, "removed in NCCL 2.4.0: no code reads it, so it has no effect",
                                       "Use NCCL_NET_GDR_LEVEL instead, or unset it."),
    params.IB_GDR_LEVEL.name: Words(Status.WARN, "renamed in NCCL 2.4.0: no code reads it, so it has no effect",
                                    "Use NCCL_NET_GDR_LEVEL instead, or unset it."),
}


def variable_evidence(ctx: DoctorContext, name: str) -> Evidence:
    """A variable's value and where NCCL gets it: the environment or a configuration file
    (src/misc/param.cc initEnvFunc, :attr:`DoctorContext.environ`)."""
    return Evidence(f"{ctx.environ_source(name)} {name}", ctx.environ[name])


def effect_finding(ctx: DoctorContext, effect: effects.Effect) -> Finding:
    words = REMOVED_WORDS[effect.param.name] if effect.kind == effects.REMOVED else WORDS[effect.kind]
    return finding(
        id=ids.nccl_variable(effect.param.name),
        status=words.status,
        summary=f"{effect.param.name}={effect.value}: {words.effect.format(detail=effect_detail(effect))}",
        evidence=(variable_evidence(ctx, effect.param.name),),
        fix=words.fix,
    )


def effect_detail(effect: effects.Effect) -> str:
    if effect.kind == effects.C2C_GDR_OFF:
        return f"; {effect.detail}" if effect.detail else ""
    return effect.detail


def c2c_gpus(ctx: DoctorContext) -> bool | None:
    """Whether a GPU of the node reaches its CPU over C2C (NVML's C2C links); None: unknown."""
    node = ctx.nccl_node
    if node.nvml_order is None:
        return None
    return any(node.gpu(gpu.bdf).c2c_links for gpu in node.gpus)


def simple_rule_findings(ctx: DoctorContext) -> list[Finding]:
    return [effect_finding(ctx, effect) for effect in effects.effects(ctx.environ, ctx.nccl_rules, c2c_gpus(ctx))]


def net_findings(ctx: DoctorContext) -> list[Finding]:
    """NCCL_NET naming the socket transport, matched as the job's NCCL matches it
    (versions.NcclRules.selects_socket: any case from 2.13.4, exactly "Socket" before)."""
    if not ctx.nccl_rules.selects_socket(ctx.environ):
        return []
    name = params.NET.name
    return [finding(id=ids.nccl_variable(name), status=Status.FAIL,
                    summary=f"{name}={params.NET.raw(ctx.environ)}: NCCL uses the socket transport: traffic "
                            "goes through host memory, no GPUDirect RDMA",
                    evidence=(variable_evidence(ctx, name),), fix=UNSET_FIX)]


# ---- NCCL_NET_GDR_LEVEL -----------------------------------------------------


def gpus_beyond_level(ctx: DoctorContext, level: GdrLevel) -> list[Evidence]:
    """Each GPU whose path to the NIC NCCL uses is farther than ``level``, so GDR is off for it."""
    return [Evidence(f"GPU {d.gpu_bdf} -> {d.nic}", d.detour_from or d.path_type) for d in ctx.nccl_decisions
            if d.nic is not None and d.path_type != "PXN" and not level.admits(d.detour_from or d.path_type)]


def gdr_level_findings(ctx: DoctorContext) -> list[Finding]:
    value = params.NET_GDR_LEVEL.raw(ctx.environ)
    if value is None:
        return []
    evidence = (variable_evidence(ctx, params.NET_GDR_LEVEL.name),)
    level = ctx.nccl_rules.gdr_level(ctx.environ)
    if level.ignored:
        return [finding(id=ids.nccl_variable(params.NET_GDR_LEVEL.name), status=Status.WARN,
                        summary=f"NCCL_NET_GDR_LEVEL={value} is not a spelling NCCL accepts (names are "
                                "case-sensitive, NODE does not exist): NCCL silently ignores it and uses its default",
                        evidence=evidence,
                        fix="Use one of PIX, PXB, P2C, PHB, SYS (upper case), or unset it.")]
    if level.undefined:
        return [finding(id=ids.nccl_variable(params.NET_GDR_LEVEL.name), status=Status.WARN,
                        summary=f"NCCL_NET_GDR_LEVEL={value} is a number NCCL stores in a C int, where it becomes "
                                "negative: NCCL then reads before its level table (undefined behaviour), so the GDR "
                                f"level is unknown; the doctor assumes the default {level.name}",
                        evidence=evidence,
                        fix="Use one of PIX, PXB, P2C, PHB, SYS (upper case), or unset it.")]
    if level_refusal(ctx.environ, ctx.nccl_rules):
        return [finding(id=ids.nccl_variable(params.NET_GDR_LEVEL.name), status=Status.FAIL,
                        summary=f"NCCL_NET_GDR_LEVEL={value} means {level.name}: no NIC is that close to a GPU, "
                                "so NCCL disables GPUDirect RDMA everywhere",
                        evidence=evidence, fix=UNSET_FIX)]
    beyond = gpus_beyond_level(ctx, level)
    if beyond:
        return [finding(id=ids.nccl_variable(params.NET_GDR_LEVEL.name), status=Status.WARN,
                        summary=f"NCCL_NET_GDR_LEVEL={value} means {level.name}: GPUDirect RDMA is off for "
                                f"{len(beyond)} GPU(s) whose NIC is farther",
                        evidence=evidence + tuple(beyond),
                        fix="Unset it (the default admits PIX, PXB and P2C) or move the NIC closer to the GPU.")]
    return [finding(id=ids.nccl_variable(params.NET_GDR_LEVEL.name), status=Status.INFO,
                    summary=f"NCCL_NET_GDR_LEVEL={value} means {level.name}; it replaces "
                            "NCCL's default (P2C from 2.29, PXB before) and admits the path to "
                            "every GPU's NIC",
                    evidence=evidence)]


# ---- NCCL_IB_HCA ------------------------------------------------------------


def active_ports(ctx: DoctorContext, nic: str) -> tuple[int, ...]:
    """The numbers of the NIC's ports NCCL would open without a filter."""
    return tuple(port.number for port in nccl_ports(nic, ctx.nccl_node.ports[nic]))


def ib_hca_findings(ctx: DoctorContext) -> list[Finding]:
    """Compare NCCL's choice with and without the filter (NCCL drops the other devices first:
    src/transport/net_ib/init.cc ncclIbInitDevices)."""
    value = params.IB_HCA.raw(ctx.environ)
    if value is None:
        return []
    hca_filter = parse_hca_filter(value)
    unfiltered = params.without(ctx.environ, params.IB_HCA)
    excluded = [Evidence(f"GPU {d.gpu_bdf} -> NCCL's NIC without the filter {d.nic}", d.path_type)
                for d in decide(ctx.nccl_node, unfiltered, ctx.nccl_rules)
                if d.nic is not None and not hca_filter.selects(d.nic, active_ports(ctx, d.nic))]
    evidence = (variable_evidence(ctx, params.IB_HCA.name),)
    if excluded:
        return [finding(id=ids.nccl_variable(params.IB_HCA.name), status=Status.WARN,
                        summary=f"NCCL_IB_HCA={value} excludes the NIC NCCL would pick for {len(excluded)} GPU(s): "
                                "NCCL will use another NIC, where GPUDirect RDMA may be off or slower",
                        evidence=evidence + tuple(excluded),
                        fix="Include those NICs in NCCL_IB_HCA (mind that names without '=' "
                            "match as prefixes), or unset it.")]
    return [finding(id=ids.nccl_variable(params.IB_HCA.name), status=Status.INFO,
                    summary=f"NCCL_IB_HCA={value} keeps the NIC NCCL picks for every GPU", evidence=evidence)]


# ---- NCCL_DMABUF_ENABLE ------------------------------------------------------


def dmabuf_enable_findings(ctx: DoctorContext) -> list[Finding]:
    """Harmless beside peer memory, fatal where DMA-BUF is the only path (src/init.cc
    dmaBufSupported, src/graph/topo.cc ncclTopoPopulateNics)."""
    value = params.DMABUF_ENABLE.raw(ctx.environ)
    if value is None or dmabuf_enabled(ctx.environ, ctx.nccl_rules):
        return []
    paths = ctx.memory_paths
    evidence = (variable_evidence(ctx, params.DMABUF_ENABLE.name),)
    if paths.peermem_file:
        return [finding(id=ids.nccl_variable(params.DMABUF_ENABLE.name), status=Status.INFO,
                        summary=f"NCCL_DMABUF_ENABLE={value}: NCCL registers GPU memory through peer memory "
                                f"({paths.peermem_file}) instead of DMA-BUF",
                        evidence=evidence)]
    if len(paths.disabled_pairs(dmabuf_enabled=True)) < len(paths.disabled_pairs()):
        return [finding(id=ids.nccl_variable(params.DMABUF_ENABLE.name), status=Status.FAIL,
                        summary=f"NCCL_DMABUF_ENABLE={value} switches off DMA-BUF, this node's only path to GPU "
                                "memory: NCCL logs \"GPU Direct RDMA Disabled\" for the HCAs",
                        evidence=evidence + paths.evidence(), fix=UNSET_FIX)]
    return [finding(id=ids.nccl_variable(params.DMABUF_ENABLE.name), status=Status.WARN,
                    summary=f"NCCL_DMABUF_ENABLE={value}: no effect today (DMA-BUF is not available here "
                            "anyway), but it will block DMA-BUF once the stack supports it",
                    evidence=evidence, fix=UNSET_FIX)]


# ---- the per-GPU decision ----------------------------------------------------


def path_words(decision: NcclGpuDecision, names: dict[str, str]) -> str:
    if decision.path == "pxn":
        return f"through {names.get(decision.via_gpu, decision.via_gpu)} over NVLink (PXN)"
    if decision.path == "c2c":
        return "over C2C through the CPU (P2C)"
    return f"direct {decision.path_type} path"


def channel_words(decision: NcclGpuDecision) -> str:
    return "; ".join(f"{c.channel}: {c.net} ({c.path_type}, GDR {'on' if c.gdr_write else 'off'})"
                     for c in decision.channels) + " (then again from channel 0)"


def socket_finding(decision: NcclGpuDecision) -> Finding:
    """A GPU whose traffic NCCL sends through its socket transport: the per-GPU answer agrees
    with the variable's finding, or with nccl.data_direct's where the node stops NCCL's IB."""
    node = data_direct.LOOKUP in decision.why[0]
    return finding(id=ids.nccl_gpu(decision.gpu_bdf), status=Status.FAIL,
                   summary=f"{decision.gpu} ({decision.gpu_bdf}): NCCL moves this GPU's traffic through host memory, "
                           f"WITHOUT GPUDirect RDMA: {decision.why[0]}",
                   evidence=(Evidence("why", decision.why[0]),), fix=DATA_DIRECT_FIX if node else UNSET_FIX)


def decision_finding(decision: NcclGpuDecision, names: dict[str, str], peermem_unregistered: bool = False,
                     library: str = "NCCL") -> Finding:
    """One GPU's decision, said of the library whose rules made it (NCCL, or RCCL on an AMD node)."""
    if decision.path == SOCKET_PATH:
        return socket_finding(decision)
    label = f"{decision.gpu} ({decision.gpu_bdf})"
    evidence = (Evidence("NIC NCCL uses (channel 0)", f"{decision.net or decision.nic}, {decision.bandwidth_gbs} GB/s; "
                                                        f"equal candidates: {', '.join(decision.candidates)}"),
                Evidence("channels", channel_words(decision)),
                Evidence("path", path_words(decision, names)),
                Evidence("GDR receive (NIC writes GPU memory)", "yes" if decision.gdr_write else "no"),
                Evidence("GDR send (NIC reads GPU memory)", "yes" if decision.gdr_read else "no"),
                Evidence("GDR mode, memory registered through", f"{decision.gdr_mode}, {decision.mechanism or '-'}"),
                *((Evidence("registration", decision.mechanism_reason),) if decision.mechanism_reason else ()),
                Evidence("why", "\n".join(decision.why)))
    where = f"{decision.net or decision.nic} {path_words(decision, names)}"
    if decision.gdr_write and decision.mechanism == "peermem" and peermem_unregistered:
        return finding(id=ids.nccl_gpu(decision.gpu_bdf), status=Status.FAIL,
                       summary=f"{label}: NCCL will use {where} with GPUDirect RDMA through nvidia-peermem, which "
                               "is not registered with the peer-memory API: registering GPU memory will fail "
                               "(see stack.peermem)",
                       evidence=evidence, fix="See stack.peermem.")
    if decision.gdr_write and decision.gdr_read:
        return finding(id=ids.nccl_gpu(decision.gpu_bdf), status=Status.OK,
                       summary=f"{label}: {library} uses {where} with GPUDirect RDMA for sends and receives",
                       evidence=evidence)
    send_reason = next(r for r in decision.why if r.startswith("send: "))[len("send: "):]
    if decision.gdr_write:
        return finding(id=ids.nccl_gpu(decision.gpu_bdf), status=Status.WARN,
                       summary=f"{label}: {library} uses {where} with GPUDirect RDMA for receives only; sends "
                               f"stage through host memory: {send_reason}",
                       evidence=evidence,
                       fix="NCCL_NET_GDR_READ=1 lets the NIC read GPU memory on sends too (measure: NCCL keeps "
                           "it off where it competes with other PCIe traffic)" if "Ampere" in send_reason
                       else UNSET_FIX)
    receive_reason = next(r for r in decision.why if r.startswith("receive: "))[len("receive: "):]
    if decision.unread:
        return finding(id=ids.nccl_gpu(decision.gpu_bdf), status=Status.WARN,
                       summary=f"{label}: {library} uses {where} without GPUDirect RDMA on the facts read "
                               f"({receive_reason}), but {decision.unread}",
                       evidence=evidence, fix=nvml.NVML_FIX)
    return finding(id=ids.nccl_gpu(decision.gpu_bdf), status=Status.FAIL,
                   summary=f"{label}: {library} uses {where} WITHOUT GPUDirect RDMA: {receive_reason}",
                   evidence=evidence, fix=decision_fix(receive_reason))


def decision_fix(reason: str) -> str:
    if "MLO partition" in reason:
        return ("Set NCCL_NET_GDR_MLOPART=1 if this partitioned GPU should use GPUDirect RDMA (NCCL leaves it off "
                "for MLO partitions by default).")
    if "GDR level" in reason and "NCCL_NET_GDR_LEVEL=" in reason:
        return "Unset NCCL_NET_GDR_LEVEL (NCCL's default admits PIX, PXB and P2C)."
    if "GDR level" in reason:
        return ("Put the NIC under the same PCIe switch as the GPU (see topology.distance), or give the GPU an "
                "NVLink peer next to a NIC (PXN). NCCL takes the fastest NIC first and only then the nearest: "
                "where a slower NIC sits nearer, NCCL_IB_HCA can restrict NCCL to it. Raising "
                "NCCL_NET_GDR_LEVEL forces GDR over a path NVIDIA calls degraded.")
    if reason.startswith("RCCL says"):
        return ("Give amdkfd a peer-memory client (a NIC stack with the peer-memory API, MLNX_OFED or DOCA "
                "with amdgpu-dkms, makes memory_peers/amdkfd/version appear), or use DMA-BUF: "
                "NCCL_DMABUF_ENABLE=1 with CONFIG_DMABUF_MOVE_NOTIFY=y and CONFIG_PCI_P2PDMA=y in "
                "/boot/config-$(uname -r).")
    if "Disabled for HCA" in reason:
        return "See stack.path: the NIC cannot register GPU memory."
    return "See the GPU findings above."


def decision_findings(ctx: DoctorContext) -> list[Finding]:
    names = {gpu.bdf: gpu.name for gpu in ctx.topology.gpus}
    unregistered = ctx.memory_paths.peermem_registered is False
    return [decision_finding(d, names, unregistered, ctx.nccl_rules.library) for d in ctx.nccl_decisions
            if d.nic is not None or d.path == SOCKET_PATH]


# ---- the NCCL the job will load ----------------------------------------------------


def library_finding(ctx: DoctorContext) -> Finding:
    """Which libnccl the job loads (librccl on an AMD node), for which Python, and the rules
    its version follows (:mod:`gdrprobe.doctor.facts.nccl_library`, :mod:`gdrprobe.nccl.versions`)."""
    library, rules = ctx.nccl_library, ctx.nccl_rules
    name, file = library.library, "librccl" if library.library == "RCCL" else "libnccl"
    rccl = rules.library == "RCCL"
    follows = rules.described if rccl else f"NCCL {dotted(MODELLED)}"
    amd = (Evidence("/sys/bus/pci/devices", f"{ctx.runtime.name}'s GPUs on the PCI bus: RCCL's "
                                            "node"),) if rccl else ()
    differences = tuple(Evidence(f"differs from {dotted(MODELLED)}", what) for what in library.differences)
    differences += tuple(Evidence("not modelled", what) for what in rules.unmodelled())
    shadowed = tuple(Evidence("also present, not loaded", other) for other in library.shadowed)
    pythons = python_evidence(library)
    if library.path is None:
        return finding(id=ids.NCCL_LIBRARY, status=Status.SKIP,
                       summary=f"no {file} found ({library.source}): the decisions below follow {follows}",
                       evidence=amd + (Evidence("where the loader looks", library.source),) + pythons,
                       fix=f"Name the job's {file} or its Python with --nccl PATH.")
    where = amd + (Evidence(library.path, library.source),) + pythons
    what = f"{name} {library.version}" if library.version else f"a {file} whose version could not be read"
    if pythons_disagree(library):
        return finding(id=ids.NCCL_LIBRARY, status=Status.WARN,
                       summary=f"which Python? The job's {name} depends on the Python that runs it, and the Pythons "
                               f"on this machine load different ones; with {library.python} the job loads {what} "
                               f"from {library.path} ({library.source}), which the decisions below follow",
                       evidence=where + shadowed + differences,
                       fix=f"Name the job's Python or its {file} with --nccl PATH (an interpreter such as "
                           "/opt/venv/bin/python3, a virtual environment, or the library).")
    if library.version is None:
        return finding(id=ids.NCCL_LIBRARY, status=Status.WARN,
                       summary=f"the job will load {library.path} ({library.source}), whose version could not be "
                               f"read: the decisions below follow {follows}",
                       evidence=where + ((Evidence("version", library.version_from),) if library.version_from else ())
                       + shadowed,
                       fix=f"Check that it is a {file}; --nccl PATH names the one the job loads.")
    if rccl:
        said = f"the decisions below follow {rules.described}"
    else:
        said = (f"the decisions below follow its rules where they differ from {dotted(MODELLED)}"
                if differences else f"its rules are {dotted(MODELLED)}'s where the doctor applies them")
    return finding(id=ids.NCCL_LIBRARY, status=Status.INFO,
                   summary=f"the job will load {name} {library.version} from {library.path} ({library.source}); "
                           + said,
                   evidence=where + (Evidence("version read from", library.version_from),) + shadowed + differences
                   + (() if rccl else (Evidence("cuMem", rules.cumem_default),)))


def python_evidence(library: NcclLibrary) -> tuple[Evidence, ...]:
    """Whose answer it is; without --nccl, what every Python found would load."""
    if library.python_named:
        return (Evidence("the job's Python", library.python),) if library.python else ()
    default = Evidence("the job's Python", f"not named (--nccl): the default is {library.python}")
    name = library.library
    return (default,) + tuple(
        Evidence(f"{name} of {c.python}", f"{c.path} ({name} {c.version or 'version unknown'}; {c.source})"
                 if c.path else "none found") for c in library.candidates)


def pythons_disagree(library: NcclLibrary) -> bool:
    """Without --nccl, whether the Pythons found would load different files."""
    return not library.python_named and len({c.path for c in library.candidates if c.path}) > 1


# ---- NCCL_NETDEVS_POLICY ------------------------------------------------------


def netdevs_policy_findings(ctx: DoctorContext) -> list[Finding]:
    """src/graph/topo.cc getNetDevsPolicyOnce: AUTO, ALL or MAX:n (n > 0), case-insensitive;
    anything else is AUTO, said only in an NCCL_DEBUG=INFO line."""
    policy = netdevs_policy(ctx.environ)
    if policy.recognised or not ctx.nccl_rules.reads(params.NETDEVS_POLICY):
        return []       # not read before 2.28.3: nccl.netdevs_policy says so (effects.NOT_READ)
    return [finding(id=ids.nccl_variable(params.NETDEVS_POLICY.name), status=Status.WARN,
                    summary=f"NCCL_NETDEVS_POLICY={policy.raw} is not a policy NCCL recognises: it uses AUTO "
                            "(each GPU spreads its channels over as many NICs as its share of the local ones)",
                    evidence=(variable_evidence(ctx, params.NETDEVS_POLICY.name),),
                    fix="Use AUTO, ALL or MAX:n with n > 0, or unset it.")]


# ---- mlx5 data-direct devices ----------------------------------------------


def nets_used(decision: NcclGpuDecision) -> set[tuple[str | None, str | None]]:
    """(RDMA device, network device) of every channel of the GPU (channel 0 where none listed)."""
    return {(ch.nic, ch.net) for ch in decision.channels} or {(decision.nic, decision.net)}


def data_direct_users(decisions) -> dict[str, list[str]]:
    """RDMA device -> the GPUs whose channels use its data-direct device."""
    users: dict[str, list[str]] = {}
    for decision in decisions:
        for nic, net in nets_used(decision):
            if nic and data_direct_net(net):
                users.setdefault(nic, []).append(decision.gpu)
    return users


def unused_reason(ctx, nic: str) -> str:
    faces = data_direct.exposed(ctx.nccl_rules, ctx.environ)
    if data_direct.DATA_DIRECT not in faces:
        return data_direct.why_exposed(ctx.nccl_rules, ctx.environ)
    return (f"NCCL opens {nic}{data_direct.SUFFIX} but picks another network device for every GPU "
            "(NCCL_IB_HCA, or one with more bandwidth or a nearer path: see nccl.gpu.<bdf>)")


DATA_DIRECT_FIX = (f"Set {data_direct.VARIABLE}=0 (NCCL then does not ask), or update the kernel's mlx5_ib and "
                   "rdma-core together; NCCL before 2.28.3 treats the error as no data-direct (NVIDIA/nccl "
                   "issue 1866).")


def broken_init_finding(ctx, broken: list[str]) -> Finding:
    probes = ctx.data_direct_probes
    return finding(
        id=ids.NCCL_DATA_DIRECT, status=Status.FAIL,
        summary=f"{ctx.nccl_rules.described} fails to start its InfiniBand/RoCE transport: "
                f"{data_direct.LOOKUP} fails on {', '.join(broken)} with an error other than ENODEV: no GPU's "
                "traffic takes an RDMA NIC",
        evidence=tuple(Evidence(nic, probes[nic].reason) for nic in broken),
        fix=DATA_DIRECT_FIX)


def usage_finding(ctx, found: list[str]) -> Finding:
    placed = ctx.nccl_node.data_direct
    users = data_direct_users(ctx.nccl_decisions)
    probes = ctx.data_direct_probes
    evidence = [Evidence(nic, probes[nic].reason + (f"; used by {', '.join(users[nic])}" if nic in users
                                                    else "; " + unused_reason(ctx, nic) if nic in placed
                                                    else "; the path is no PCI function in sysfs: not placed"))
                for nic in found]
    unused = [nic for nic in found if nic not in users]
    if not unused:
        return finding(id=ids.NCCL_DATA_DIRECT, status=Status.OK,
                       summary="NCCL uses the data-direct device of " + ", ".join(found), evidence=tuple(evidence))
    return finding(
        id=ids.NCCL_DATA_DIRECT, status=Status.WARN,
        summary=f"data-direct available but not used: {', '.join(unused)} "
                f"{'has' if len(unused) == 1 else 'have'} a data-direct device NCCL does not send through",
        evidence=tuple(evidence),
        fix=f"Use NCCL 2.27.6 or newer with {data_direct.VARIABLE} unset (or 1): NCCL then opens <dev>_dma alone, "
            "at the data-direct path; on GB300-class nodes it carries NIC-to-GPU writes at PCIe speed.")


def domain_findings(decisions) -> list[Finding]:
    return [finding(id=ids.nccl_data_direct_domain(d.gpu_bdf), status=Status.WARN,
                    summary=f"{d.gpu} uses {d.net}, a data-direct device in PCI domain {d.data_direct[:4]}, "
                            f"not the GPU's ({d.gpu_bdf[:4]})",
                    evidence=(Evidence("GPU", d.gpu_bdf), Evidence(d.net, d.data_direct)),
                    fix="Give each GPU the NIC whose data-direct device shares its PCI domain (NCCL_IB_HCA, "
                        "the job's GPUs); data-direct registration is reported to succeed only there.")
            for d in decisions if d.data_direct and d.data_direct[:4] != d.gpu_bdf[:4]]


def data_direct_findings(ctx) -> list[Finding]:
    probes = ctx.data_direct_probes
    broken = [nic for nic, probe in probes.items()
              if data_direct.breaks_init(ctx.nccl_rules, ctx.environ, probe, ctx.ports.get(nic), nic)]
    if broken:
        return [broken_init_finding(ctx, broken)]
    found = [nic for nic, probe in probes.items() if probe.path]
    if not found:
        return []
    return [usage_finding(ctx, found)] + domain_findings(ctx.nccl_decisions)


# ---- the check --------------------------------------------------------------


def check(ctx: DoctorContext) -> list[Finding]:
    findings = (simple_rule_findings(ctx) + net_findings(ctx) + dmabuf_enable_findings(ctx)
                + gdr_level_findings(ctx) + ib_hca_findings(ctx) + netdevs_policy_findings(ctx))
    if not findings:
        findings.append(environment_ok_finding(ctx))
    return [library_finding(ctx)] + findings + decision_findings(ctx) + data_direct_findings(ctx)


def environment_ok_finding(ctx: DoctorContext) -> Finding:
    nccl_variables = params.library_variables(ctx.environ)
    return finding(
        id=ids.NCCL_ENV,
        status=Status.OK,
        summary="no NCCL variable restricts GPUDirect RDMA" if nccl_variables
        else "no NCCL variables are set; NCCL uses its defaults",
        evidence=tuple(variable_evidence(ctx, name) for name in nccl_variables),
    )
