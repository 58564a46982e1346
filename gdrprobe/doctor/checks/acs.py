"""PCIe Access Control Services on the path NCCL's traffic takes between each GPU (or its PXN
peer) and the NIC NCCL uses for it, and, in a virtual machine, ATS on that NIC.

With Request Redirect or Completion Redirect enabled, a switch's downstream port sends peer
transactions it receives up to the root complex instead of across to the peer port, which is
the opposite of what GPUDirect RDMA needs. With Egress Control enabled, the Egress Control
Vector names the ports that peer requests may not go to directly: they are blocked, or
redirected upstream when Request Redirect is on too (PCIe Base Specification, ACS Extended
Capability: ACSCtl bit 5, the vector at offset 0x08, sized by ACSCap bits 15:8). The state is
read from the ACS extended capability of each port's config space (the part only root can
read).

Which ports matter: only the downstream ports of the switch where the GPU's and the NIC's
paths meet (:meth:`gdrprobe.doctor.facts.topology.Topology.meeting_ports`), where their
traffic would turn. A port below that switch forwards the traffic upstream whatever its bits
(the peer is not below it), and a GPU and a NIC under different root ports meet only in the
root complex, which the traffic crosses whatever those root ports say. Linux turns SrcValid,
ReqRedir, CmpltRedir and UpstreamFwd on at every port with the capability whenever an IOMMU
driver asks for ACS (drivers/pci/pci.c pci_std_enable_acs, from pci_enable_acs once
pci_request_acs was called), root ports included: on those ports the bits are reported, as
no fault. NVIDIA's NCCL guide asks for ACS off on PCI switches on bare metal, and for ATS on
the network adapters in virtual machines, where ACS must stay (NCCL's
docs/userguide/source/troubleshooting/gpu_troubleshooting.rst, "PCI Access Control Services").
The fix is named only where it changes the path: ``setpci`` until the next boot, or the
kernel's ``pci=disable_acs_redir=`` (drivers/pci/pci.c pci_disable_acs_redir: ReqRedir,
CmpltRedir and EgressCtrl cleared on the listed devices after the kernel enabled ACS).
"""

from __future__ import annotations

import dataclasses

from gdrprobe.doctor.facts import pci
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status

GROUP = ids.ACS
ACS_CAPABILITY_ID = 0x000D
ACS_CAPABILITY_OFFSET = 4    # ACSCap, 16 bits after the header
ACS_CONTROL_OFFSET = 6       # ACSCtl, a 16-bit register after the header and ACSCap
ACS_EGRESS_VECTOR_OFFSET = 8
EGRESS_CONTROL_BIT = 5

# ACSCtl bits in register order, with the names lspci prints.
ACS_CONTROL_BITS = (("SV", "SrcValid"), ("TB", "TransBlk"), ("RR", "ReqRedir"),
                    ("CR", "CmpltRedir"), ("UF", "UpstreamFwd"), ("EC", "EgressCtrl"),
                    ("DT", "DirectTrans"))
REDIRECTING_BITS = ("RR", "CR")


@dataclasses.dataclass(frozen=True)
class AcsState:
    """What a bridge's config space says about ACS."""

    bdf: str
    readable: bool              # False: config space missing or only the 64-byte header
    capability_offset: int | None
    control: int | None
    egress_vector: int | None = None   # the Egress Control Vector, read when EgressCtrl is on

    def enabled(self) -> tuple[str, ...]:
        if self.control is None:
            return ()
        return tuple(short for bit, (short, _) in enumerate(ACS_CONTROL_BITS)
                     if self.control >> bit & 1)

    def redirects(self) -> bool:
        return any(bit in REDIRECTING_BITS for bit in self.enabled())

    def egress_blocks(self) -> bool:
        """EgressCtrl on with a port in its vector: peer requests to that port are blocked or
        redirected. A vector that cannot be read counts as set."""
        return "EC" in self.enabled() and self.egress_vector != 0

    def in_the_way(self) -> bool:
        return self.redirects() or self.egress_blocks()


def decode_control(control: int) -> str:
    """ACSCtl the way lspci -vvv shows it: SrcValid- TransBlk- ReqRedir+ ..."""
    return " ".join(f"{name}{'+' if control >> bit & 1 else '-'}"
                    for bit, (_, name) in enumerate(ACS_CONTROL_BITS))


def read_acs(root, bdf: str) -> AcsState:
    config = pci.read_config(root, bdf)
    if config is None or pci.config_truncated_for_user(config):
        return AcsState(bdf, readable=False, capability_offset=None, control=None)
    offset = pci.extended_capabilities(config).get(ACS_CAPABILITY_ID)
    if offset is None or offset + ACS_CONTROL_OFFSET + 2 > len(config):
        return AcsState(bdf, readable=True, capability_offset=None, control=None)
    start = offset + ACS_CONTROL_OFFSET
    control = int.from_bytes(config[start:start + 2], "little")
    return AcsState(bdf, readable=True, capability_offset=offset, control=control,
                    egress_vector=egress_vector(config, offset) if control >> EGRESS_CONTROL_BIT & 1 else None)


def egress_vector(config: bytes, offset: int) -> int | None:
    """The Egress Control Vector: ACSCap bits 15:8 give its size in bits (0 means 256)."""
    capability = int.from_bytes(config[offset + ACS_CAPABILITY_OFFSET:offset + ACS_CAPABILITY_OFFSET + 2],
                                "little")
    bits = (capability >> 8 & 0xFF) or 256
    start = offset + ACS_EGRESS_VECTOR_OFFSET
    end = start + (bits + 31) // 32 * 4
    return int.from_bytes(config[start:end], "little") if end <= len(config) else None


def _evidence(state: AcsState) -> Evidence:
    source = pci.config_path(state.bdf)
    if state.capability_offset is None:
        return Evidence(source, "no ACS extended capability")
    vector = "" if state.egress_vector is None else f"; Egress Control Vector 0x{state.egress_vector:x}"
    return Evidence(f"{source} @0x{state.capability_offset + ACS_CONTROL_OFFSET:x}",
                    f"ACSCtl 0x{state.control:04x}: {decode_control(state.control)}{vector}")


def gdr_pairs(ctx):
    """Each GPU NCCL moves data for (or, on a PXN path, the NVLink peer that talks to the
    NIC) with the NIC it uses: (gpu, nic) devices, once each."""
    topology = ctx.topology
    gpus = {gpu.bdf: gpu for gpu in topology.gpus}
    nics = {nic.name: nic for nic in topology.nics}
    pairs = {}
    for decision in ctx.nccl_decisions:
        gpu = gpus.get(decision.via_gpu or decision.gpu_bdf)
        nic = nics.get(decision.nic) if decision.nic is not None else None
        if gpu is not None and nic is not None:
            pairs.setdefault(f"{gpu.name}-{nic.name}", (gpu, nic))
    return pairs


def ports_by_role(ctx) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(port -> the pairs whose traffic turns there, port -> the pairs it is on the way of
    without turning): the meeting switch's downstream ports, and every other bridge between."""
    turning: dict[str, list[str]] = {}
    passing: dict[str, list[str]] = {}
    topology = ctx.topology
    for label, (gpu, nic) in gdr_pairs(ctx).items():
        meeting = topology.meeting_ports(gpu, nic)
        for bdf in meeting:
            turning.setdefault(bdf, []).append(label)
        for bdf in topology.bridges_between(gpu, nic):
            if bdf not in meeting:
                passing.setdefault(bdf, []).append(label)
    return turning, {bdf: pairs for bdf, pairs in passing.items() if bdf not in turning}


def persistent_fix(bdf: str) -> str:
    return (f"Disable ACS on the switch in the BIOS, or clear its redirection at boot with the kernel parameter "
            f"pci=disable_acs_redir={bdf} (Linux sets it again on every boot while an IOMMU driver asks for ACS), "
            f"or until the next reboot run as root: setpci -s {bdf} ECAP_ACS+0x6.w=0000")


def redirect_finding(state: AcsState, pairs: list[str], in_vm: bool) -> Finding:
    enabled = "+".join(state.enabled())
    effect = ("redirects peer traffic of {pairs} to the root complex" if state.redirects()
              else "blocks or redirects peer traffic of {pairs} to the ports in its Egress Control Vector")
    summary = (f"ACS on bridge {state.bdf} ({enabled}) " + effect.format(pairs=", ".join(pairs))
               + ": a port of the switch where they meet")
    if in_vm:
        return Finding(ids.ACS_BRIDGE, GROUP, Status.WARN, summary + " (virtual machine)", (_evidence(state),),
                       "ACS cannot be disabled from a guest and protects its isolation: peer traffic goes "
                       "directly only as ATS-translated requests the host's ports let through (see acs.ats); "
                       "the hypervisor's operator owns the host's ACS.")
    return Finding(ids.ACS_BRIDGE, GROUP, Status.FAIL, summary, (_evidence(state),), persistent_fix(state.bdf))


def no_turn_finding(clear: list[AcsState], passing: dict[str, list[str]], states: dict[str, AcsState],
                    rc_pairs: list[str]) -> Finding | None:
    """The ports that leave NCCL's traffic where it is: the meeting ports with nothing in the
    way, and the other ports on the way whose bits would redirect at a turn (``passing``:
    Linux's own, with an IOMMU), which their traffic does not make there."""
    if not (clear or passing or rc_pairs):
        return None
    parts = []
    if clear:
        parts.append(f"no ACS redirection or egress blocking on {len(clear)} port(s) where GPUs meet their NICs")
    if rc_pairs:
        parts.append(f"{', '.join(rc_pairs)} meet only in the root complex, which their traffic crosses whatever "
                     "ACS says")
    if passing:
        parts.append(f"ACS on {len(passing)} other port(s) on the way (root ports, upstream ports, ports below "
                     "the meeting switch) does not change the path")
    evidence = tuple(_evidence(s) for s in clear)
    evidence += tuple(Evidence(f"{e.source} ({', '.join(passing[bdf])})", e.value)
                      for bdf in sorted(passing) for e in (_evidence(states[bdf]),))
    return Finding(ids.ACS_BRIDGE, GROUP, Status.OK, "; ".join(parts), evidence)


def ats_finding(ctx, nic) -> Finding:
    """In a virtual machine, NCCL's guide asks for ATS on the network adapters: advised only
    where the NIC's ATS Control says it is off."""
    state = pci.ats_enabled(ctx.root, nic.bdf)
    source = Evidence(pci.config_path(nic.bdf), {True: "ATS Control Enable+", False: "ATS Control Enable-",
                                                 None: "no ATS capability visible"}[state])
    if state:
        return Finding(ids.ACS_ATS, GROUP, Status.OK, f"ATS is on on {nic.name} ({nic.bdf}): what NCCL's guide asks "
                                                      "for in a virtual machine", (source,))
    if state is False:
        return Finding(ids.ACS_ATS, GROUP, Status.WARN,
                       f"ATS is off on {nic.name} ({nic.bdf}) in a virtual machine, where ACS stays on: peer "
                       "traffic goes through the root complex", (source,),
                       "Enable ATS on the NIC (ConnectX firmware: mlxconfig ATS_ENABLED=true) and in the "
                       "hypervisor, as NCCL's guide asks for virtual machines.")
    return Finding(ids.ACS_ATS, GROUP, Status.INFO,
                   f"the guest does not see an ATS capability on {nic.name} ({nic.bdf}): whether ATS is on is the "
                   "host's to tell (mlxconfig ATS_ENABLED, the hypervisor's device assignment)", (source,))


def check(ctx) -> list[Finding]:
    topology = ctx.topology
    if not (topology.gpus and topology.nics):
        return [Finding(ids.ACS_BRIDGE, GROUP, Status.SKIP, "no GPU-NIC pair to check",
                        (Evidence(pci.PCI_DEVICES_DIR, "no GPU and PCI RDMA NIC pair"),))]
    pairs = gdr_pairs(ctx)
    turning, passing = ports_by_role(ctx)
    in_vm = topology.virtualization.is_vm
    ats = [ats_finding(ctx, nic) for nic in dict.fromkeys(nic for _, nic in pairs.values())] if in_vm else []
    if not (turning or passing):
        return [Finding(ids.ACS_BRIDGE, GROUP, Status.SKIP,
                        "no bridge between any GPU and the NIC NCCL uses for it (flat topology)",
                        (Evidence("sysfs PCI tree", "GPUs and NICs sit directly on root buses"),))] + ats
    states = {bdf: read_acs(ctx.root, bdf) for bdf in sorted({*turning, *passing})}
    judged = [states[bdf] for bdf in sorted(turning)]
    findings = [redirect_finding(s, turning[s.bdf], in_vm) for s in judged if s.in_the_way()]
    hidden = [s for s in judged if not s.readable]
    if hidden:
        findings.append(Finding(
            ids.ACS_BRIDGE, GROUP, Status.SKIP,
            f"config space beyond 64 bytes not readable on {len(hidden)} port(s) where GPUs meet their NICs: ACS "
            "unknown",
            tuple(Evidence(pci.config_path(s.bdf), "permission denied" if ctx.root.is_denied(pci.config_path(s.bdf))
                           else "64 bytes or less readable") for s in hidden),
            "Run the doctor as root (sudo) so the kernel returns the extended config space."))
    rc_pairs = [label for label, (gpu, nic) in pairs.items() if not topology.meeting_ports(gpu, nic)]
    clear = [s for s in judged if s.readable and not s.in_the_way()]
    in_the_way = {bdf: labels for bdf, labels in passing.items() if states[bdf].in_the_way()}
    settled = no_turn_finding(clear, in_the_way, states, rc_pairs)
    return findings + ([settled] if settled else []) + ats
