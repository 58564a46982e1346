"""All rails at once in the lab (issue 32; docs/lab.md#all-rails-at-once): one q35 guest with a
PCIe switch holding two stand-in GPUs and two Soft-RoCE rails, each rail's loopback traffic
shaped to a line rate, and, when capped, through one uplink both rails share.

The guest's PCI tree (QEMU 7.2's x3130 switch under a root port):

    root port 00:12.0 -- switch 01:00.0 --+-- 03:00.0 "GPU0" (gdr_pci_standin)
                                          +-- 04:00.0 "GPU1" (gdr_pci_standin)
                                          +-- 05:00.0 e1000e -- rocep5s0
                                          +-- 06:00.0 e1000e -- rocep6s0

The lab's rdma_rxe (lab/dmabuf/rxe/rxe_rails.c) gives each rxe device its netdev's PCI
function as parent, so NCCL's rules and the doctor place both rails under the switch (where
rdma-core's udev rule renames them by that place, rdma_rename NAME_FALLBACK), and
shapes their loopback: ``rail_mbit`` per device, ``uplink_mbit`` shared. The stand-in
libcuda.so.1 lists its GPUs at 03:00.0 and 04:00.0, which gdr_pci_standin shows as NVIDIA
functions. Everything else is real: verbs, the node check's threads, barrier and windows.
Emulation, not hardware proof: no PCIe link is narrow here, the shaper stands for it.

  python -m lab.rails guest FOLDER    (in the rails guest) set the rails up, print what
                                      `gdrprobe doctor` names the rails' shared element, run
                                      `check --node --all-rails` uncapped and capped, print
                                      each report's rails JSON; keep all for the lab test
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lab.kernel import REPO, LabError
from lab.dmabuf_guest import (GUEST_SCRIPT, Built, dmabuf_environment, guest_main,
                              write_rxe_knob)

GPU_BUS_IDS = ("0000:03:00.0", "0000:04:00.0")
NIC_BUS_IDS = ("0000:05:00.0", "0000:06:00.0")
SWITCH = "0000:01:00.0"
QEMU_OPTS = ("-device pcie-root-port,id=railport,bus=pcie.0,addr=0x12,chassis=18,slot=18 "
             "-device x3130-upstream,id=railswitch,bus=railport "
             + " ".join(f"-device xio3130-downstream,id=rail{n},bus=railswitch,addr={n},"
                        f"chassis=19,slot={n}" for n in range(4)) + " "
             "-device virtio-rng-pci,bus=rail0 -device virtio-rng-pci,bus=rail1 "
             "-netdev hubport,id=railnet0,hubid=20 -device e1000e,netdev=railnet0,bus=rail2 "
             "-netdev hubport,id=railnet1,hubid=21 -device e1000e,netdev=railnet1,bus=rail3")
# Each rail's line rate, and the uplink's when capped: one rail's worth, so two rails keep
# about half each together. Low enough that two rails at once stay clear of what the
# emulated CPUs copy (the uncapped rails must keep their solo rate).
RAIL_MBIT = 120
UPLINK_MBIT = 120
JUMBO_MTU = 9000              # rxe's 4096-byte IB MTU: a quarter of the packets of 1500's
# The emulated CPUs stall for tens of milliseconds on a busy host: 8 x 67 ms before a QP
# resends (rxe_rails.c), so the resends do not take a shaped rail's share.
TIMEOUT_SCALE = 8
# Set in the guest's environment with the folder of the kept reports; the lab test skips
# without it.
REPORTS = "GDRPROBE_LAB_RAILS_REPORTS"
CASES = {"uncapped": (RAIL_MBIT, 0), "capped": (RAIL_MBIT, UPLINK_MBIT)}
# The check's windows are about a second long (campaign.gate.sized_for_budget) and count
# whole messages: at a rail's 15 MB/s, 256 KiB messages make a rate of some 57 of them a
# window (1 MiB ones, 14: a message more or less would move a ratio by 7 %).
CHECK_ARGS = ("check", "--node", "--all-rails", "--floor", "0", "--json", "-s", "256K",
              "--time-budget", "240", "--repeats", "5")
CHECK_TIMEOUT_S = 400
# One set-up step in the guest (a module loaded, a link added): seconds, not minutes.
STEP_TIMEOUT_S = 60


def sh(*argv: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        raise LabError(f"'{' '.join(argv)}' did not end within {STEP_TIMEOUT_S} s") from error
    if done.returncode != 0:
        raise LabError(f"'{' '.join(argv)}' failed: {done.stderr.strip() or done.stdout.strip()}")


def one_child(bus_id: str, kind: str) -> str:
    """The one netdev (kind "net") or RDMA device ("infiniband") on a PCI function."""
    folder = f"/sys/bus/pci/devices/{bus_id}/{kind}"
    names = os.listdir(folder) if os.path.isdir(folder) else []
    if len(names) != 1:
        raise LabError(f"{bus_id} has {kind} devices {names}, not one")
    return names[0]


def rail_names() -> list[str]:
    """The rails' RDMA devices, by the PCI function each sits on (once udev renamed them)."""
    subprocess.run(["udevadm", "settle", "--timeout=30"], capture_output=True)
    return [one_child(bus_id, "infiniband") for bus_id in NIC_BUS_IDS]


def set_up(built: Built) -> None:
    """The lab's rxe in place of Debian's, the stand-in GPUs named, a rail on each e1000e."""
    sh("bash", GUEST_SCRIPT, "load", built.folder)
    sh("rdma", "link", "delete", "rxe0")        # guest.sh's rxe0 on lo: not a rail
    sh("insmod", built.pci_standin, "gpus=" + ",".join(GPU_BUS_IDS))
    write_rxe_knob("timeout_scale", TIMEOUT_SCALE)
    sh("modprobe", "e1000e")
    for index, bus_id in enumerate(NIC_BUS_IDS):
        netdev = one_child(bus_id, "net")
        sh("ip", "link", "set", "dev", netdev, "mtu", str(JUMBO_MTU), "up")
        sh("ip", "addr", "add", f"10.77.{index}.1/24", "dev", netdev)
        sh("rdma", "link", "add", f"rxe{index}", "type", "rxe", "netdev", netdev)
    print(f"rails: {', '.join(rail_names())} under the switch {SWITCH}, with stand-in GPUs at "
          f"{', '.join(GPU_BUS_IDS)}")


def environment(built: Built) -> dict:
    """The check's: the stand-in's GPUs where gdr_pci_standin shows them, compute capability
    9.0 (CUDA's attributes 75 and 76), so NCCL's rules are a Hopper node's (GDR for sends
    and receives, no flush)."""
    return {**dmabuf_environment(built), "GDRPROBE_STANDIN_DEVICES": str(len(GPU_BUS_IDS)),
            "GDRPROBE_STANDIN_FIRST_BUS": GPU_BUS_IDS[0].split(":")[1],
            "GDRPROBE_STANDIN_ATTRIBUTES": "75=9,76=0"}


def gdrprobe_json(built: Built, args: tuple[str, ...], lock_dir: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "gdrprobe", *args], capture_output=True,
                          text=True, timeout=CHECK_TIMEOUT_S, cwd=REPO,
                          env={**environment(built), "GDRPROBE_LOCK_DIR": lock_dir})
    if not done.stdout.strip():
        raise LabError(f"gdrprobe {' '.join(args)} printed nothing (exit {done.returncode}):\n"
                       f"{done.stderr[-3000:]}")
    return done.returncode, json.loads(done.stdout)


def check_all_rails(built: Built, rates: tuple[int, int], lock_dir: str) -> tuple[int, dict]:
    write_rxe_knob("rail_mbit", rates[0])
    write_rxe_knob("uplink_mbit", rates[1])
    return gdrprobe_json(built, CHECK_ARGS, lock_dir)


def finding(report: dict, finding_id: str) -> dict | None:
    return next((item for item in report["findings"] if item["id"] == finding_id), None)


def doctor_rails(built: Built, kept: str) -> None:
    """The doctor's view of the same node: where the rails meet, and its matrix."""
    _, report = gdrprobe_json(built, ("doctor", "--json"), kept)
    with open(os.path.join(kept, "doctor.json"), "w") as handle:
        json.dump(report, handle)
    rails, matrix = finding(report, "topology.rails"), finding(report, "topology.matrix")
    print(f"== doctor: {rails['summary'] if rails else 'no topology.rails finding'}")
    if matrix:
        print(matrix["evidence"][0]["value"])


def summary(case: str, code: int, report: dict) -> str:
    """A line per rail alone and together, and the node's aggregate and start skews."""
    rails = report.get("rails") or {}
    lines = [f"{case}: exit {code}, rails {rails.get('verdict')}: {rails.get('detail', '')}"]
    for gpu in report.get("gpus", ()):
        verdict = (gpu.get("report") or {}).get("verdict") or {}
        lines.append(f"  alone: {gpu['gpu']} on {gpu['nic']}: exit {gpu['exit_code']}, "
                     f"{verdict.get('classification')} {gpu.get('error', '')}")
        if gpu["exit_code"]:
            lines += [f"    {line}" for line in verdict.get("evidence", ())]
    for rail in rails.get("rails", ()):
        lines.append(f"  together: {rail['nic']} with {rail['gpu']}: solo {rail['solo_gbps']:.3f} "
                     f"Gb/s, together {rail['concurrent_gbps'] or 0:.3f} Gb/s, ratio {rail['ratio']}")
    skews = [f"{overlap['skew_s'] * 1000:.0f} ms of {overlap['shortest_s']:.2f} s"
             for overlap in (rails.get("overlap"), rails.get("host_overlap")) if overlap]
    if skews:
        lines.append(f"  aggregate {rails['aggregate_gbps']:.3f} Gb/s (solo sum "
                     f"{rails['solo_sum_gbps']:.3f}); start skew GPU pass, host pass: "
                     + ", ".join(skews))
    return "\n".join(lines)


def guest(folder: str) -> int:
    built = Built(folder)
    set_up(built)
    kept = os.environ.get(REPORTS) or os.path.join(REPO, ".lab-cache", "rails-reports")
    os.makedirs(kept, exist_ok=True)
    doctor_rails(built, kept)
    for case, (rail, uplink) in CASES.items():
        code, report = check_all_rails(built, (rail, uplink), kept)
        print(f"== check --node --all-rails, {case} (rail {rail or 'unshaped'} Mbit/s, uplink "
              f"{uplink or 'none'}): exit {code}")
        print(json.dumps(report.get("rails"), indent=1))
        with open(os.path.join(kept, f"{case}.json"), "w") as handle:
            json.dump({"exit_code": code, "report": report}, handle)
        print(summary(case, code, report))
    return 0


if __name__ == "__main__":
    sys.exit(guest_main(__doc__, guest, sys.argv[1:]))
