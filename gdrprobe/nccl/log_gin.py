"""What an NCCL log says of GPU-initiated networking (GIN), per host (the formats:
:data:`gdrprobe.nccl.log_formats.GIN_FORMATS`, ``OFI_GIN_FORMATS``):

- the backend NCCL assigned ("Assigned GIN plugin %s to comm", 2.28.7-2.30.3; "GIN/Plugin:
  Assigned plugin %s type %d to comm", 2.30.7): GDAKI (GIN_IB_GDAKI, type 3), the proxy
  (GIN_IB_PROXY, type 2), or a plugin's (aws-ofi-nccl's EFA-GDA, type 5);
- GDAKI's doorbell: DOCA GPUNetIO's "Enabling CPU proxy mode" says a CPU thread rings it. DOCA
  prints it at WARNING, which it shows only with DOCA_GPUNETIO_LOG at 4 or more
  (doca_gpunetio_log.cpp), so its absence proves nothing: GDAKI without it is reported as
  "GDAKI, doorbell not logged";
- why there is no GIN: "GIN is disabled.", "GIN not supported.", "No GIN-capable devices
  found.", "Unable to use GIN: ...", the compute capability, symmetric memory;
- the aws-ofi-nccl plugin's own: "gin: Initializing", "gin GDAKI: createContext done" (the GPU
  rings EFA's doorbell) or why not.

What it remembers is bounded by the hosts the reader remembers (nccl/log.py) and a few
strings per host.
"""

from __future__ import annotations

from gdrprobe.nccl.gin import CPU_PROXY, EFA_GDA, GDAKI, GIN_TYPE_NAMES, GPU_INITIATED, NO_GIN, PROXY
from gdrprobe.report.nccl_log import GinHost, GinLog

MAX_GIN_REASONS = 16         # distinct reasons kept per host (NCCL has 12 ways to say no)
DOORBELL_NOT_LOGGED = "GDAKI, doorbell handler not logged"
NOT_LOGGED = ("DOCA GPUNetIO says \"Enabling CPU proxy mode\" only at DOCA_GPUNETIO_LOG=4 or more: "
              "without that line the log cannot tell whether the GPU or a CPU thread rings the doorbell; "
              "gdrprobe check --gin answers it on the node")
PLUGIN_BACKENDS = {"GIN_IB_GDAKI": GDAKI, "GIN_IB_PROXY": PROXY}


class GinTally:
    __slots__ = ("backend", "plugin", "cpu_proxy", "gdaki_qps", "reasons", "ofi", "efa_gda")

    def __init__(self) -> None:
        self.backend: str | None = None
        self.plugin: str | None = None
        self.cpu_proxy = self.gdaki_qps = 0
        self.reasons: dict[str, None] = {}
        self.ofi = self.efa_gda = False

    def reason(self, text: str) -> None:
        if text in self.reasons or len(self.reasons) < MAX_GIN_REASONS:
            self.reasons[text] = None


def tally(scan, host: str) -> GinTally:
    found = scan.gin.get(host)
    if found is None:
        found = scan.gin[host] = GinTally()
    return found


def read_off(scan, number: int, host: str, match, cut: bool) -> None:
    tally(scan, host).reason(scan.values(match.group("why")))


def read_symmetric(scan, number: int, host: str, match, cut: bool) -> None:
    if match.group("cumem") == "0":
        tally(scan, host).reason("Symmetric memory is not supported: cuMemEnable 0 (NCCL_CUMEM_ENABLE)")


def read_plugin(scan, number: int, host: str, match, cut: bool) -> None:
    found = tally(scan, host)
    found.plugin = scan.names(match.group("name"))
    kind = match.groupdict().get("type")
    found.backend = GIN_TYPE_NAMES.get(int(kind), f"type {kind}") if kind else \
        PLUGIN_BACKENDS.get(match.group("name"), found.plugin)


def read_gdaki_qp(scan, number: int, host: str, match, cut: bool) -> None:
    found = tally(scan, host)
    found.gdaki_qps += 1
    found.backend = found.backend or GDAKI


def read_cpu_proxy(scan, number: int, host: str, match, cut: bool) -> None:
    tally(scan, host).cpu_proxy += 1


def read_ofi_gin(scan, number: int, host: str, match, cut: bool) -> None:
    tally(scan, host).ofi = True


def read_ofi_gdaki(scan, number: int, host: str, match, cut: bool) -> None:
    found = tally(scan, host)
    if match.group("done"):
        found.efa_gda = True
        found.backend = EFA_GDA
    else:
        found.reason(f"aws-ofi-nccl: gin GDAKI: {match.group('why')}")


READERS = {"gin-off": read_off, "gin-symmetric": read_symmetric, "gin-plugin": read_plugin,
           "gin-gdaki-qp": read_gdaki_qp, "gin-cpu-proxy": read_cpu_proxy, "ofi-gin": read_ofi_gin,
           "ofi-gin-gdaki": read_ofi_gdaki}


# What ncclGinConnectOnce and the device runtime say when a communicator gets no GIN at all,
# whatever backend was assigned at init.
NO_CONNECTION = ("GIN is disabled", "GIN not supported", "No GIN-capable devices found",
                 "Communicator does not support symmetric memory", "User requested GIN but not all ranks")


def host_mode(found: GinTally) -> tuple[str, str]:
    """(mode, why) for one host."""
    failed = [reason for reason in found.reasons if reason.startswith(NO_CONNECTION)]
    if failed:
        return NO_GIN, "; ".join(failed)
    if found.efa_gda:
        return GPU_INITIATED, "aws-ofi-nccl's EFA-GDA: the GPU rings EFA's doorbell (\"createContext done\")"
    if found.backend == EFA_GDA:
        return (NO_GIN, "; ".join(found.reasons)) if found.reasons else \
            (EFA_GDA, "EFA-GDA assigned; the plugin's \"createContext done\" is not in the log")
    if found.backend == GDAKI and found.cpu_proxy:
        return CPU_PROXY, "GDAKI, but DOCA GPUNetIO said \"Enabling CPU proxy mode\": a CPU thread rings the doorbell"
    if found.backend == GDAKI:
        return DOORBELL_NOT_LOGGED, NOT_LOGGED
    if found.backend == PROXY or (found.ofi and found.backend not in (None, GDAKI)):
        return CPU_PROXY, f"the GIN proxy backend ({found.plugin or PROXY}): a CPU thread posts the GPU's operations"
    if found.backend is not None:
        return found.backend, f"GIN backend {found.plugin}"
    if found.reasons:
        return NO_GIN, "; ".join(found.reasons)
    return "not in log", "the plugin's GIN started, no backend was assigned in the log" if found.ofi else ""


def gin_summary(scan) -> GinLog | None:
    """Every host the log says something of GIN about; None where it says nothing."""
    if not scan.gin:
        return None
    tallies = dict(scan.gin)
    nameless = tallies.pop("", None)       # DOCA's line carries no NCCL prefix, so no host
    if nameless is not None:
        gdaki = [found for found in tallies.values() if found.backend == GDAKI]
        for found in gdaki:
            found.cpu_proxy += nameless.cpu_proxy
        if not gdaki or nameless.backend or nameless.reasons:
            tallies[""] = nameless
    hosts = []
    for host, found in tallies.items():
        mode, why = host_mode(found)
        hosts.append(GinHost(host=host, mode=mode, backend=found.backend, plugin=found.plugin, why=why,
                             reasons=tuple(found.reasons), cpu_proxy_lines=found.cpu_proxy,
                             gdaki_qps=found.gdaki_qps))
    modes = sorted({host.mode for host in hosts})
    return GinLog(mode=modes[0] if len(modes) == 1 else "mixed: " + ", ".join(modes), hosts=tuple(hosts))
