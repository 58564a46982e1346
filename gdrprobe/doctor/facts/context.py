"""What every doctor check reads from: the file-system root, the environment, the node's GPU
runtime (asked once: :attr:`DoctorContext.runtime`) and its facts collector, and the facts
only a live call can give (the GPU runtime's, NVML, NCCL's NIC DMA-BUF probe).

On the live machine the environment is ``os.environ`` and those facts come from the
driver, NVML and verbs. When ``--root`` points at a captured tree, they come from the
files the capture command wrote under ``CAPTURE_DIR`` inside that tree, so a replay sees
what the live run saw. Either way NCCL's configuration files (NCCL_CONF_FILE or
~/.nccl.conf, then /etc/nccl.conf) are read under the root and merged in as NCCL merges
them (:func:`gdrprobe.nccl.env.with_conf_files`).
"""

from __future__ import annotations

import functools
import os
from typing import Any
from collections.abc import Mapping

from types import ModuleType

from gdrprobe.doctor.capture_shape import MAX_CAPTURE_JSON_BYTES, damaged, load_captured, shape_of
from gdrprobe.doctor.facts import CAPTURE_DIR, cuda, pci
from gdrprobe.doctor.facts.container import Container, detect_container
from gdrprobe.doctor.facts.memory_path import (KERNEL_RELEASE_FILE, driver_version_line,
                                               read_memory_paths)
from gdrprobe.doctor.facts.nccl_library import find_nccl_library
from gdrprobe.doctor.facts.pythons import this_python
from gdrprobe.doctor.facts.nccl_node import collect_node_facts
from gdrprobe.doctor.facts.nic_facts import collect_nic_facts
from gdrprobe.doctor.facts.nvml import collect_nvml_facts
from gdrprobe.doctor.facts.runtimes import collector
from gdrprobe.doctor.facts.topology import NcclTopologyFile, Topology, build_topology, read_nccl_topology_file
from gdrprobe.nccl.data_direct import DataDirectProbe, read_probe
from gdrprobe.nccl.decision import NodeFacts, decide
from gdrprobe.nccl.env import with_conf_files
from gdrprobe.nccl.gdr_support import MemoryPaths
from gdrprobe.nccl.topo import NcclPciTree, Port
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report.model import NcclGpuDecision, NcclLibrary
from gdrprobe.sysroot import SysRoot

ENVIRON_FILE = CAPTURE_DIR + "/environ.json"
NVML_FACTS_FILE = CAPTURE_DIR + "/nvml.json"
NIC_FACTS_FILE = CAPTURE_DIR + "/nics.json"
NCCL_FACTS_FILE = CAPTURE_DIR + "/nccl.json"
GIN_FACTS_FILE = CAPTURE_DIR + "/gin.json"


class DoctorContext:
    """Shared, lazily computed inputs of the doctor's checks. ``nccl``: the job's libnccl,
    or its Python (:mod:`gdrprobe.doctor.facts.nccl_library`), a path on the machine."""

    def __init__(self, root: SysRoot, environ: Mapping[str, str] | None = None, nccl: str | None = None):
        self.root = root
        self._environ = environ
        self._nccl = os.path.abspath(nccl) if nccl else None
        self._captured: dict[str, Any] = {}

    @property
    def live(self) -> bool:
        return self.root.root == "/"

    @functools.cached_property
    def process_environ(self) -> Mapping[str, str]:
        """The process environment alone: given, live, or captured."""
        if self._environ is not None:
            return self._environ
        if self.live:
            return dict(os.environ)
        return self.captured(ENVIRON_FILE) or {}

    @functools.cached_property
    def _nccl_environ(self) -> tuple[dict[str, str], dict[str, str]]:
        return with_conf_files(self.process_environ, self._read_conf_file, self.nccl_rules)

    @property
    def environ(self) -> Mapping[str, str]:
        """The environment as NCCL sees it: the process's, then its configuration files."""
        return self._nccl_environ[0]

    def environ_source(self, name: str) -> str:
        """Where a variable of :attr:`environ` comes from: "environment" or a file's path."""
        return self._nccl_environ[1].get(name, "environment")

    def _read_conf_file(self, path: str) -> str | None:
        # fopen resolves a relative NCCL_CONF_FILE against the working directory.
        data = self.root.read_bytes(os.path.join(os.getcwd(), path), 1 << 20)
        return None if data is None else data.decode("utf-8", "replace")

    @functools.cached_property
    def runtime(self):
        """The node's GPU runtime (:class:`gdrprobe.memory.runtime.GpuRuntime`), asked once:
        the one GDRPROBE_GPU_RUNTIME names, else the one whose GPUs the PCI bus holds."""
        from gdrprobe.memory.runtime import machine_runtime

        return machine_runtime(self.root, self.process_environ)

    @functools.cached_property
    def gpu_collector(self) -> ModuleType:
        """The runtime's facts collector (:mod:`gdrprobe.doctor.facts.runtimes`)."""
        return collector(self.runtime)

    @functools.cached_property
    def gpu_facts(self) -> dict[str, Any] | None:
        """What only a live call into the node's GPU runtime tells (the collector's
        ``collect``: CUDA's inventory, ROCm's kallsyms and HSA answers), or None where a
        replayed capture has none."""
        if not self.live:
            return self.captured(self.gpu_collector.FACTS_FILE)
        return self.gpu_collector.collect(self)

    @property
    def cuda_facts(self) -> dict[str, Any] | None:
        """The CUDA driver's inventory (:func:`gdrprobe.doctor.facts.cuda.gpu_inventory`, or
        ``{"error": ...}``) on a CUDA node; None on another runtime's, or where a replay has
        none."""
        return self.gpu_facts if self.gpu_collector is cuda else None

    @functools.cached_property
    def nvml_facts(self) -> dict[str, Any] | None:
        """GPU facts from NVML (:mod:`gdrprobe.doctor.facts.nvml`), or None when none were
        captured."""
        if not self.live:
            return self.captured(NVML_FACTS_FILE)
        return collect_nvml_facts([gpu.bdf for gpu in self.topology.gpus])

    @functools.cached_property
    def nic_facts(self) -> dict[str, Any] | None:
        """NCCL's DMA-BUF probe per NIC (:mod:`gdrprobe.doctor.facts.nic_facts`), or None."""
        if not self.live:
            return self.captured(NIC_FACTS_FILE)
        return collect_nic_facts([nic.name for nic in self.topology.nics])

    @functools.cached_property
    def data_direct_probes(self) -> dict[str, DataDirectProbe]:
        """Per PCI NIC: NCCL's data-direct sequence through libmlx5, live or captured with the
        NIC facts (:mod:`gdrprobe.nccl.data_direct`)."""
        facts = (self.nic_facts or {}).get("data_direct") or {}
        devices = facts.get("devices") or {}
        return {nic.name: read_probe(devices.get(nic.name), facts.get("error"))
                for nic in self.topology.nics}

    @functools.cached_property
    def nccl_search(self) -> dict[str, Any]:
        """What finding the job's NCCL needs beyond files: --nccl, this interpreter's
        site-packages and executable, versions and dynamic sections read from libraries'
        bytes (live: found now; replay: captured)."""
        captured = ({} if self.live else self.captured(NCCL_FACTS_FILE)) or {}
        interpreter = this_python() if self.live else captured
        return {"nccl": self._nccl or captured.get("nccl"),
                "site_packages": interpreter.get("site_packages", []), "executable": interpreter.get("executable"),
                "versions_in_bytes": dict(captured.get("versions_in_bytes", {})),
                "elf_dynamic": dict(captured.get("elf_dynamic", {}))}

    @functools.cached_property
    def nccl_library(self) -> NcclLibrary:
        """The libnccl the job will load, where it came from, and its version."""
        search = self.nccl_search
        library, read = find_nccl_library(self.root, self.process_environ, search,
                                          self.gpu_collector.COLLECTIVE)
        for kind, facts in read.items():
            search[kind].update(facts)
        return library

    @functools.cached_property
    def nccl_rules(self) -> NcclRules:
        """The rules of the collective library the job will load, the runtime's (its
        collector's ``COLLECTIVE``): NCCL's (unknown: 2.30.7's); on a ROCm node RCCL's
        (:mod:`gdrprobe.nccl.rccl`) by its release, on the topology of the NCCL its version
        names."""
        return self.gpu_collector.COLLECTIVE.rules(self.nccl_library.version,
                                                   self.root.realpath(self.nccl_library.path)
                                                   if self.nccl_library.path else None)

    @functools.cached_property
    def topology(self) -> Topology:
        return build_topology(self.root)

    @functools.cached_property
    def nccl_topology_file(self) -> NcclTopologyFile:
        """NCCL's topology file, read as the job's NCCL reads it, and where it puts the devices."""
        return read_nccl_topology_file(self.root, self.environ, self.environ_source,
                                       self.nccl_rules.effective, self.topology)

    @functools.cached_property
    def ports(self) -> dict[str, tuple[Port, ...]]:
        """Every RDMA device's ports (software devices too) as sysfs states them."""
        return {device: pci.rdma_ports(self.root, device) for device in pci.rdma_devices(self.root)}

    @functools.cached_property
    def driver_line(self) -> str | None:
        """The NVIDIA kernel driver's version line (its flavour), or None without a driver."""
        return driver_version_line(self.root)

    @functools.cached_property
    def kernel_release(self) -> str | None:
        return self.root.read(KERNEL_RELEASE_FILE)

    @functools.cached_property
    def container(self) -> Container:
        """Whether the doctor runs in a container, and which kind (the fixes depend on it)."""
        return detect_container(self)

    @functools.cached_property
    def unopenable_nics(self) -> dict[str, str]:
        """PCI NICs NCCL will not use because this process cannot open them, with why:
        libibverbs lists a device only when its /dev/infiniband node exists (rdma-core
        libibverbs/init.c try_access_device) and NCCL skips one it cannot open (NCCL 2.30.7
        src/transport/net_ib/init.cc ncclIbInitDevices). A NIC whose node sysfs does not
        name is kept: nothing says it cannot be opened. A replay opens the capture's
        placeholder of the node, so it sees what existed."""
        from gdrprobe.rdma.devices import open_refusal, verbs_node

        refused = {}
        for nic in self.topology.nics:
            refusal = open_refusal(nic.name, self.root) if verbs_node(nic.name, self.root) \
                else None
            if refusal is not None:
                refused[nic.name] = refusal[1]
        return refused

    @functools.cached_property
    def memory_paths(self) -> MemoryPaths:
        """Per NIC and GPU: can NCCL (RCCL on a ROCm node) register GPU memory, and through
        what (NCCL's R1-R4, the runtime's collective library's rules)."""
        return self.gpu_collector.memory_paths(self, read_memory_paths(self))

    @functools.cached_property
    def nccl_node(self) -> NodeFacts:
        """What NCCL's rules read of this machine (:mod:`gdrprobe.doctor.facts.nccl_node`)."""
        return collect_node_facts(self)

    @functools.cached_property
    def nccl_tree(self) -> NcclPciTree:
        """The PCI switches as the job's NCCL sees them (Broadcom ones flattened)."""
        node = self.nccl_node
        return NcclPciTree(node.gpus + node.nics + tuple(node.data_direct.values()), dict(node.switch_ids),
                           self.nccl_rules.bcm_flatten)

    @functools.cached_property
    def gin_facts(self) -> dict[str, Any]:
        """GIN's live facts on an EFA node (libfabric's fi_version(), the aws-ofi-nccl plugin;
        :mod:`gdrprobe.doctor.facts.gin`), live or captured; {} elsewhere."""
        from gdrprobe.doctor.facts.gin import collect_gin_facts, nic_provider

        if not self.live:
            return self.captured(GIN_FACTS_FILE) or {}
        devices = ((self.nic_facts or {}).get("data_direct") or {}).get("devices") or {}
        efa = any(nic_provider(self.root, nic.name, devices)[0] == "efa" for nic in self.topology.nics)
        return collect_gin_facts(self.root, self.environ, efa)

    @functools.cached_property
    def gin_node(self):
        """What GIN's rules read of this node (:mod:`gdrprobe.nccl.gin`)."""
        from gdrprobe.doctor.facts.gin import gin_node

        return gin_node(self, self.gin_facts)

    @functools.cached_property
    def nccl_decisions(self) -> tuple[NcclGpuDecision, ...]:
        """Per GPU: the NIC NCCL uses, through which path, and whether with GPUDirect RDMA."""
        return decide(self.nccl_node, self.environ, self.nccl_rules)

    def check_capture(self) -> None:
        """Every capture file the replay reads, checked by shape before any check runs
        (:mod:`gdrprobe.doctor.capture_shape`): a DamagedCapture names the first one that
        is not what ``capture`` writes. Nothing to check on the live machine."""
        if self.live:
            return
        environ = [ENVIRON_FILE] if self._environ is None else []
        for path in (*environ, self.gpu_collector.FACTS_FILE, NVML_FACTS_FILE, NIC_FACTS_FILE,
                     NCCL_FACTS_FILE, GIN_FACTS_FILE):
            self.captured(path)

    def captured(self, path: str) -> Any:
        """A capture file's JSON, read once and checked by shape (None where it is absent)."""
        if path not in self._captured:
            self._captured[path] = self._read_captured(path)
        return self._captured[path]

    def _read_captured(self, path: str) -> Any:
        name = path.lstrip("/")
        data = self.root.read_bytes(path, MAX_CAPTURE_JSON_BYTES + 1)
        if data is not None:
            return load_captured(name, data, shape_of(name))
        if self.root.is_denied(path):
            raise damaged(name, "this user may not read it")
        if self.root.why_refused(path):
            raise damaged(name, f"it is {self.root.why_refused(path)}, not a regular file")
        return None

