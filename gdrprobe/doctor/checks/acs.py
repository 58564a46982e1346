"""PCIe Access Control Services on the bridges between each GPU and the NIC NCCL uses for it.

With Request Redirect or Completion Redirect enabled, a switch port sends peer
transactions up to the root complex instead of across to the peer, which is the
opposite of what GPUDirect RDMA needs. With Egress Control enabled, the Egress Control
Vector names the ports that peer requests may not go to directly: they are blocked, or
redirected upstream when Request Redirect is on too (PCIe Base Specification, ACS
Extended Capability: ACSCtl bit 5, the vector at offset 0x08, sized by ACSCap bits 15:8).
The state is read from the ACS extended capability of each bridge's config space (the
part only root can read).
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


def bridges_on_paths(ctx) -> dict[str, list[str]]:
    """Bridge BDF -> the GPU-NIC pairs whose peer traffic crosses it: each GPU with the NIC
    NCCL uses for it, or, on a PXN path, the NVLink peer that talks to that NIC."""
    topology = ctx.topology
    by_bdf = {e.bdf: e for e in topology.gpus}
    nics = {nic.name: nic for nic in topology.nics}
    crossing: dict[str, list[str]] = {}
    for decision in ctx.nccl_decisions:
        if decision.nic is None:
            continue
        gpu, nic = by_bdf[decision.via_gpu or decision.gpu_bdf], nics[decision.nic]
        for bdf in topology.bridges_between(gpu, nic):
            pair = f"{gpu.name}-{nic.name}"
            if pair not in crossing.setdefault(bdf, []):
                crossing[bdf].append(pair)
    return crossing


def redirect_finding(state: AcsState, pairs: list[str], in_vm: bool) -> Finding:
    enabled = "+".join(state.enabled())
    effect = ("redirects peer traffic of {pairs} to the root complex" if state.redirects()
              else "blocks or redirects peer traffic of {pairs} to the ports in its Egress Control Vector")
    summary = f"ACS on bridge {state.bdf} ({enabled}) " + effect.format(pairs=", ".join(pairs))
    if in_vm:
        return Finding(ids.ACS_BRIDGE, GROUP, Status.WARN, summary + " (virtual machine)",
                       (_evidence(state),),
                       "ACS cannot be disabled from a guest and protects its isolation; enable "
                       "ATS on the NIC (ConnectX firmware ATS_ENABLED) and in the hypervisor instead.")
    return Finding(ids.ACS_BRIDGE, GROUP, Status.FAIL, summary, (_evidence(state),),
                   f"Disable ACS in the BIOS, or until the next reboot run as root: "
                   f"setpci -s {state.bdf} ECAP_ACS+0x6.w=0000")


def check(ctx) -> list[Finding]:
    topology = ctx.topology
    if not (topology.gpus and topology.nics):
        return [Finding(ids.ACS_BRIDGE, GROUP, Status.SKIP, "no GPU-NIC pair to check",
                        (Evidence(pci.PCI_DEVICES_DIR, "no GPU and PCI RDMA NIC pair"),))]
    crossing = bridges_on_paths(ctx)
    if not crossing:
        return [Finding(ids.ACS_BRIDGE, GROUP, Status.SKIP,
                        "no bridge between any GPU and the NIC NCCL uses for it (flat topology)",
                        (Evidence("sysfs PCI tree", "GPUs and NICs sit directly on root buses"),))]
    states = [read_acs(ctx.root, bdf) for bdf in sorted(crossing)]
    in_vm = topology.virtualization.is_vm
    findings = [redirect_finding(s, crossing[s.bdf], in_vm) for s in states if s.in_the_way()]
    hidden = [s for s in states if not s.readable]
    if hidden:
        findings.append(Finding(
            ids.ACS_BRIDGE, GROUP, Status.SKIP,
            f"config space beyond 64 bytes not readable on {len(hidden)} bridge(s): ACS unknown",
            tuple(Evidence(pci.config_path(s.bdf), "permission denied" if ctx.root.is_denied(pci.config_path(s.bdf))
                           else "64 bytes or less readable") for s in hidden),
            "Run the doctor as root (sudo) so the kernel returns the extended config space."))
    clear = [s for s in states if s.readable and not s.in_the_way()]
    if clear:
        findings.append(Finding(
            ids.ACS_BRIDGE, GROUP, Status.OK,
            f"no ACS redirection or egress blocking on {len(clear)} bridge(s) between GPUs and their NICs",
            tuple(_evidence(s) for s in clear)))
    return findings
