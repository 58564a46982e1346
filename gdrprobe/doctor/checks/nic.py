"""The NIC half: RDMA devices visible, ports up, a RoCE v2 GID, verbs device nodes, mlx5 advice."""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Mapping

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.pci import INFINIBAND_CLASS_DIR, PCI_DEVICES_DIR, rdma_devices
from gdrprobe.nccl.topo import Port
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

GROUP = ids.NIC
finding = functools.partial(Finding, group=GROUP)

DEV_INFINIBAND = "/dev/infiniband"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# Kernel modules whose presence without an RDMA device names the likely cause.
NIC_DRIVER_WITHOUT_IB = (("mlx5_core", "mlx5_ib"), ("bnxt_en", "bnxt_re"), ("ice", "irdma"))


# ---- facts ------------------------------------------------------------------


def port_file(root: SysRoot, device: str, port: str, name: str) -> str | None:
    return root.read(f"{INFINIBAND_CLASS_DIR}/{device}/ports/{port}/{name}")


def roce_v2_gid_indices(root: SysRoot, device: str, port: str) -> list[str]:
    """GID table entries of type RoCE v2 that hold an address (unused entries read as zero).
    The type is read first: an unused entry's type does not read (EINVAL on the lab's 6.1
    kernel), so of a table of 1024 only the few RoCE v2 entries' GIDs are read."""
    port_dir = f"{INFINIBAND_CLASS_DIR}/{device}/ports/{port}"
    return [index for index in root.listdir(f"{port_dir}/gid_attrs/types")
            if root.read(f"{port_dir}/gid_attrs/types/{index}") == "RoCE v2"
            and root.read(f"{port_dir}/gids/{index}") not in (None, "", ZERO_GID)]


def device_driver(root: SysRoot, device: str) -> str | None:
    link = root.readlink(f"{INFINIBAND_CLASS_DIR}/{device}/device/driver")
    return posixpath.basename(link) if link else None


def uverbs_node(root: SysRoot, device: str) -> str | None:
    """The /dev/infiniband node the kernel created for a device (e.g. "uverbs0")."""
    nodes = root.listdir(f"{INFINIBAND_CLASS_DIR}/{device}/device/infiniband_verbs")
    return nodes[0] if nodes else None


# ---- findings ---------------------------------------------------------------


def sysfs_finding(root: SysRoot) -> Finding | None:
    """/sys without PCI devices is a container or chroot without a proper sysfs mount."""
    if root.listdir(PCI_DEVICES_DIR):
        return None
    return finding(id=ids.NIC_SYSFS, status=Status.FAIL,
                   summary="/sys shows no PCI devices: sysfs is not mounted properly, so neither the RDMA devices "
                           "nor the PCI topology can be discovered",
                   evidence=(Evidence(PCI_DEVICES_DIR, "empty or absent"),),
                   fix="Mount sysfs at /sys (in a container, do not mask /sys; the runtime's default read-only "
                       "sysfs mount is enough).")


def no_device_finding(root: SysRoot) -> Finding:
    evidence = [Evidence(INFINIBAND_CLASS_DIR, "empty or absent")]
    causes = []
    for nic_driver, ib_driver in NIC_DRIVER_WITHOUT_IB:
        if root.exists(f"/sys/module/{nic_driver}") and not root.exists(f"/sys/module/{ib_driver}"):
            evidence.append(Evidence(f"/sys/module/{ib_driver}", f"absent while {nic_driver} is loaded"))
            causes.append(f"load {ib_driver} (`modprobe {ib_driver}`)")
    causes += ["check that an RDMA-capable NIC is installed (`lspci | grep -i -e mellanox -e infiniband`)",
               "in a container, the RDMA namespace must share the host's devices (`rdma system` shows the mode)",
               "for Soft-RoCE, create the device with `rdma link add rxe0 type rxe netdev <if>`"]
    fix = "; ".join(causes)
    return finding(id=ids.NIC_DEVICES, status=Status.FAIL, summary="no RDMA devices are visible",
                   evidence=tuple(evidence), fix=fix[0].upper() + fix[1:] + ".")


def port_findings(root: SysRoot, device: str, port: Port) -> list[Finding]:
    state, number = port.state or "unknown", str(port.number)
    port_dir = f"{INFINIBAND_CLASS_DIR}/{device}/ports/{number}"
    findings = []
    if "ACTIVE" not in state:
        physical = port_file(root, device, number, "phys_state")
        findings.append(finding(
            id=ids.nic_port(device, number, "state"), status=Status.WARN,
            summary=f"{device} port {number} is {state} (physical state {physical})",
            evidence=(Evidence(port_dir + "/state", state), Evidence(port_dir + "/phys_state", str(physical))),
            fix="Check the cable and the switch port; on InfiniBand, a port stuck in INIT needs a subnet manager.",
        ))
    if port.link_layer == "Ethernet" and not roce_v2_gid_indices(root, device, number):
        findings.append(finding(
            id=ids.nic_port(device, number, "roce_v2_gid"), status=Status.WARN,
            summary=f"{device} port {number} is Ethernet but has no RoCE v2 GID, so routable RoCE is impossible",
            evidence=(Evidence(port_dir + "/gid_attrs/types/*", "no 'RoCE v2' entry"),),
            fix="Give the port's network interface an IP address and bring it up; GIDs follow its addresses.",
        ))
    return findings


def ports_summary_finding(ports: Mapping[str, tuple[Port, ...]]) -> Finding:
    states = {(device, port.number): port.state or "unknown" for device, listed in ports.items() for port in listed}
    active = [name for name, state in states.items() if "ACTIVE" in state]
    return finding(
        id=ids.NIC_PORTS,
        status=Status.OK if active else Status.FAIL,
        summary=f"{len(active)} of {len(states)} RDMA ports are active",
        evidence=tuple(Evidence(f"{INFINIBAND_CLASS_DIR}/{device}/ports/{port}/state", state)
                       for (device, port), state in states.items()),
        fix="" if active else "Bring at least one port up (cable, switch port, subnet manager on InfiniBand).",
    )


def device_nodes_finding(ctx: DoctorContext, devices: list[str]) -> Finding:
    present = set(ctx.root.listdir(DEV_INFINIBAND))
    expected = {device: uverbs_node(ctx.root, device) for device in devices}
    missing = [f"{device} ({node})" for device, node in expected.items() if node and node not in present]
    # Present but refused to this process (NCCL skips them: ncclIbInitDevices).
    refused = [f"{device} ({why})" for device, why in ctx.unopenable_nics.items()
               if f"{device} ({expected.get(device)})" not in missing]
    evidence = (Evidence(DEV_INFINIBAND, ", ".join(sorted(present)) or "empty or absent"),)
    if not missing and not refused:
        return finding(id=ids.NIC_DEV_INFINIBAND, status=Status.OK,
                       summary="every RDMA device has its verbs node in /dev/infiniband", evidence=evidence)
    container = ctx.container
    if not missing:
        fix = ("Run as a user who may open them (rdma-core's udev rules make them 0666), or allow them in "
               "the container's devices cgroup.")
    elif container.kind == "kubernetes":
        fix = "Request the NIC through the RDMA device plugin (e.g. nvidia.com/hostdev or rdma/rdma_shared_device_a)."
    elif container.kind:
        fix = "Pass /dev/infiniband into the container (`--device=/dev/infiniband`)."
    else:
        fix = "Load the verbs character-device module: `modprobe ib_uverbs`."
    parts = ((["verbs device nodes are missing for " + ", ".join(missing) + ": no process can open them"]
              if missing else [])
             + (["this process cannot open " + ", ".join(refused) + ": NCCL skips them"] if refused else []))
    return finding(id=ids.NIC_DEV_INFINIBAND, status=Status.FAIL, summary="; ".join(parts),
                   evidence=evidence + container.evidence, fix=fix)


def scatter_to_cqe_finding(ctx: DoctorContext, devices: list[str]) -> Finding | None:
    """mlx5 may place small received data in the CQE; with GPU buffers that can fail MR allocation."""
    mlx5 = [device for device in devices if device_driver(ctx.root, device) == "mlx5_core"
            or device.startswith("mlx5")]
    if not mlx5:
        return None
    value = ctx.environ.get("MLX5_SCATTER_TO_CQE")
    evidence = (Evidence("environment MLX5_SCATTER_TO_CQE", str(value)),)
    if value == "0":
        return finding(id=ids.NIC_MLX5_SCATTER_TO_CQE, status=Status.OK,
                       summary="MLX5_SCATTER_TO_CQE=0: scatter-to-CQE is off for GPU buffers", evidence=evidence)
    return finding(id=ids.NIC_MLX5_SCATTER_TO_CQE, status=Status.INFO,
                   summary=f"mlx5 devices ({', '.join(mlx5)}) with scatter-to-CQE on; if registering GPU memory "
                           "fails with \"Couldn't allocate MR\", turn it off",
                   evidence=evidence, fix="Set MLX5_SCATTER_TO_CQE=0 in the environment of the process.")


def check(ctx: DoctorContext) -> list[Finding]:
    broken_sysfs = sysfs_finding(ctx.root)
    if broken_sysfs:
        return [broken_sysfs]
    devices = rdma_devices(ctx.root)
    if not devices:
        return [no_device_finding(ctx.root)]
    findings = [finding(id=ids.NIC_DEVICES, status=Status.OK, summary=f"RDMA devices: {', '.join(devices)}",
                        evidence=(Evidence(INFINIBAND_CLASS_DIR, ", ".join(devices)),)),
                ports_summary_finding(ctx.ports)]
    for device, ports in ctx.ports.items():
        for port in ports:
            findings += port_findings(ctx.root, device, port)
    findings.append(device_nodes_finding(ctx, devices))
    scatter = scatter_to_cqe_finding(ctx, devices)
    return findings + ([scatter] if scatter else [])
