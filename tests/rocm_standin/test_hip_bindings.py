"""gdrprobe.memory.rocm through the real hip-python over a stand-in HIP runtime and HSA
(standin.c, compiled here): binding call shapes and each failure's answer, not a GPU.

    PYTHONPATH=<where hip-python is> .venv/bin/python -m pytest tests/rocm_standin

hip-python dlopens libamdhip64.so when first called, so each case runs in a child Python
whose LD_LIBRARY_PATH starts with the stand-in. Skipped where hip-python is not installed
(the optional extra gdrprobe[rocm]) or no C compiler is found.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from gdrprobe.errors import ExitCode
from tests.rocm_standin.build import build

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[1]
CHILD_TIMEOUT_S = 120

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("hip") is None,
                       reason="hip-python is not installed: pip install 'gdrprobe[rocm]'"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to build the stand-in"),
]

PREAMBLE = """
import json
from gdrprobe.errors import GdrprobeError
from gdrprobe.memory import rocm
from gdrprobe.memory.gpu import DmaBufGpuMemory, PeermemGpuMemory, choose_mechanism
from gdrprobe.memory.nic_probe import NicDmaBufSupport
from gdrprobe.memory.spec import reported_mechanism
out = {}
try:
"""
EPILOGUE = """
except GdrprobeError as error:
    out = {"error": type(error).__name__, "cause": error.cause, "exit": int(error.exit_code)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def standin() -> pathlib.Path:
    """The stand-in under both names: hip-python opens libamdhip64.so, RCCL and gdrprobe
    libhsa-runtime64.so (build.py)."""
    return build()


def run(standin: pathlib.Path, body: str, **knobs: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GDRPROBE_H",))}
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, (str(standin), env.get("LD_LIBRARY_PATH"))))
    env["PYTHONPATH"] = ":".join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    env.update(knobs)
    code = PREAMBLE + "\n".join("    " + line for line in body.strip().splitlines()) + EPILOGUE
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_gpu_by_ordinal_and_by_bus_id_names_itself_as_sysfs_does(standin):
    found = run(standin, """
with rocm.open_gpu("1") as gpu:
    out = gpu.describe()
with rocm.open_gpu("0000:1C:00.0") as same:
    out["by_bus_id"] = same.ordinal
""", GDRPROBE_HIP_DEVICES="2")
    assert found == {"ordinal": 1, "name": "gdrprobe stand-in MI300X 1", "pci_bus_id": "0000:1c:00.0",
                     "dma_buf_supported": 1, "by_bus_id": 1}


def test_peer_memory_registers_the_hip_address_and_the_payload_round_trips(standin):
    found = run(standin, """
with rocm.open_gpu("0") as gpu, PeermemGpuMemory(gpu, 1 << 20) as memory:
    memory.fill_pattern(0, 1 << 20, 7)
    out = {"check": memory.verify_pattern(0, 1 << 20, 7), "wrong_seed": memory.verify_pattern(0, 64, 8)[0],
           "address_is_hip": memory.address == memory.buffer.ptr, "bus": memory.describe()["pci_bus_id"],
           "peer_memory": memory.describe()["peer_memory"],
           "named": reported_mechanism("peermem", memory.describe()["peer_memory"])}
""")
    assert found["check"] == [0, -1] and found["wrong_seed"] > 0
    assert found["address_is_hip"] and found["bus"] == "0000:1b:00.0"
    assert (found["peer_memory"], found["named"]) == ("amdkfd", "peermem (amdkfd)")


def test_dmabuf_is_exported_through_hsa_with_the_buffers_offset(standin):
    found = run(standin, """
with rocm.open_gpu("0") as gpu, DmaBufGpuMemory(gpu, 4096) as memory:
    fd, offset = gpu.export_dmabuf(memory.buffer.ptr + 100, 1000)
    out = {"offset": offset, "fd": fd >= 0, "address": memory.address}
""")
    assert found == {"offset": 100, "fd": True, "address": 0}


@pytest.mark.parametrize("knobs, error, exit_code, words", [
    ({"GDRPROBE_HIP_DEVICES": "0"}, "NotTestable", ExitCode.NOT_TESTABLE,
     "no GPU: HIP sees none (hipInit(0) returned hipErrorNoDevice)"),
    ({"GDRPROBE_HIP_FAIL": "hipMalloc=2"}, "GpuOutOfMemory", ExitCode.NOT_TESTABLE,
     "HIP is out of memory"),
    ({"GDRPROBE_HIP_FAIL": "hipMemcpy=999"}, "HipError", ExitCode.RDMA,
     "a HIP call failed (hipMemcpy(4096 bytes, hipMemcpyHostToDevice) returned hipErrorUnknown)"),
    ({"GDRPROBE_HSA_EXPORT": "0"}, "RegistrationFailed", None, "returned hsa_status_t 0x1000"),
    ({"GDRPROBE_HSA_SHORT": "1"}, "RegistrationFailed", None, "short of the"),
    ({"GDRPROBE_HSA_DMABUF": "0"}, "NotTestable", ExitCode.NOT_TESTABLE,
     "cannot export DMA-BUF (HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED=0)"),
])
def test_each_failure_of_the_stand_in_is_its_documented_answer(standin, knobs, error, exit_code, words):
    found = run(standin, """
with rocm.open_gpu("0") as gpu, PeermemGpuMemory(gpu, 4096) as memory:
    memory.zero()
    gpu.export_dmabuf(memory.buffer.ptr, 4096)
""", **knobs)
    assert found["error"] == error and words in found["cause"]
    if exit_code is not None:
        assert found["exit"] == exit_code


def test_auto_takes_peer_memory_where_hsa_cannot_export_and_says_why(standin):
    found = run(standin, """
with rocm.open_gpu("0") as gpu:
    out = list(choose_mechanism("auto", gpu.attributes, NicDmaBufSupport(True, 9, "the NIC can")))
""", GDRPROBE_HSA_DMABUF="0")
    assert found == ["peermem", "auto fell back to peermem (amdkfd): the GPU cannot export DMA-BUF "
                                "(HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED=0)"]


def test_hsa_exports_the_pages_hipmalloc_allocated(standin):
    """HIP and HSA are one object (build.py links the names), so the export finds the
    allocation: here its memfd (the same pages), where the lab's exporter is loaded a
    dma-buf of them (./dev demo-rocm)."""
    found = run(standin, """
import ctypes, os
with rocm.open_gpu("0") as gpu, PeermemGpuMemory(gpu, 8192) as memory:
    memory.fill_pattern(0, 8192, 3)
    fd, offset = gpu.export_dmabuf(memory.buffer.ptr + 4096, 4096)
    exported = os.pread(fd, 4096, offset)
    out = {"name": os.readlink(f"/proc/self/fd/{fd}"), "offset": offset,
           "same_pages": exported == ctypes.string_at(memory.buffer.ptr + 4096, 4096)}
""")
    assert found == {"name": "/memfd:gdrprobe-standin-hip (deleted)", "offset": 4096, "same_pages": True}


def test_a_peermem_refusal_on_rocm_names_amdkfd_not_nvidia_peermem(standin):
    found = run(standin, """
import errno
with rocm.open_gpu("0") as gpu, PeermemGpuMemory(gpu, 4096) as memory:
    refusal = OSError(errno.EFAULT, "Bad address")
    refusal.error_code = errno.EFAULT
    failed = memory._refused(refusal)
    out = {"cause": failed.cause, "fix": failed.fix, "client": failed.peer_memory}
""")
    assert found["client"] == "amdkfd"
    assert "amdkfd's PeerDirect" in found["cause"] and "nvidia-peermem" not in found["cause"] + found["fix"]
