"""The GPU-runtime seam (gdrprobe/memory/runtime.py): the runtime is what the PCI bus holds,
and only the runtime's own files name it."""

import ast
import json
import pathlib

import pytest

from gdrprobe.errors import GpuOutOfMemory, GpuUnusable, HipError, NotTestable
from gdrprobe.report.model import Status
from gdrprobe.memory import cuda, cuda_driver, rocm, runtime
from gdrprobe.sysroot import SysRoot

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gdrprobe"


def pci_function(tmp_path, bdf: str, vendor: str, pci_class: str) -> None:
    device = tmp_path / "sys/bus/pci/devices" / bdf
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")


def not_asked(*args):
    raise AssertionError("not asked")


OTHER = runtime.GpuRuntime("other", "other", 0x1002, not_asked, not_asked)


@pytest.fixture
def two_runtimes(monkeypatch):
    monkeypatch.setattr(runtime, "runtimes", lambda: [cuda.RUNTIME, OTHER])
    return OTHER


def test_an_nvidia_gpu_on_the_bus_is_driven_by_cuda(tmp_path, two_runtimes):
    pci_function(tmp_path, "0000:00:1f.0", "0x8086", "0x060100")
    pci_function(tmp_path, "0000:3b:00.0", "0x10de", "0x030200")
    assert runtime.machine_runtime(SysRoot(str(tmp_path))) is cuda.RUNTIME


def test_another_vendors_gpu_is_driven_by_its_runtime(tmp_path, two_runtimes):
    pci_function(tmp_path, "0000:3b:00.0", "0x10de", "0x020000")   # an NVIDIA NIC: no GPU
    pci_function(tmp_path, "0000:c1:00.0", "0x1002", "0x030200")
    assert runtime.machine_runtime(SysRoot(str(tmp_path))) is two_runtimes


def test_no_gpu_on_the_bus_is_the_first_runtime_whose_answer_says_what_is_missing(
        tmp_path, two_runtimes):
    pci_function(tmp_path, "0000:00:1f.0", "0x8086", "0x060100")
    assert runtime.machine_runtime(SysRoot(str(tmp_path))) is cuda.RUNTIME


def test_cuda_asks_for_its_library_through_the_seam(monkeypatch):
    monkeypatch.setattr(runtime, "machine_runtime", lambda root=None: cuda.RUNTIME)
    monkeypatch.setattr(cuda_driver, "driver_library_error", lambda: "no libcuda.so.1 here")
    with pytest.raises(Exception, match="no CUDA driver") as raised:
        runtime.require_gpu_library()
    assert "no libcuda.so.1 here" in raised.value.evidence


def imported_modules(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", sorted(
    [PACKAGE / "memory" / "gpu.py", PACKAGE / "memory" / "buffers.py", PACKAGE / "__init__.py",
     *PACKAGE.glob("campaign/*.py"), *PACKAGE.glob("cli*.py"), *PACKAGE.glob("cli/*.py")]),
    ids=lambda path: str(path.relative_to(PACKAGE)))
def test_the_providers_campaigns_and_cli_never_name_a_runtime(path):
    named = {module for module in imported_modules(path)
             if module.startswith(("gdrprobe.memory.cuda", "cuda", "gdrprobe.memory.rocm", "hip"))}
    assert named == set()


def test_cuda_and_its_vmm_allocator_no_longer_import_each_other():
    assert "gdrprobe.memory.cuda" not in imported_modules(PACKAGE / "memory" / "cuda_vmm.py")
    assert "gdrprobe.memory.cuda_vmm" in imported_modules(PACKAGE / "memory" / "cuda.py")


@pytest.mark.parametrize("pci_class", ["0x120000", "0x038000", "0x030000"])
def test_an_amd_gpu_on_the_bus_is_driven_by_rocm(tmp_path, pci_class):
    """MI300X shows as a processing accelerator (0x1200), MI200 as a display controller."""
    pci_function(tmp_path, "0000:1b:00.0", "0x1002", pci_class)
    pci_function(tmp_path, "0000:1c:00.0", "0x15b3", "0x020700")
    assert runtime.machine_runtime(SysRoot(str(tmp_path))) is rocm.RUNTIME


def test_an_amd_function_that_is_no_gpu_leaves_cuda_the_default(tmp_path):
    pci_function(tmp_path, "0000:00:14.0", "0x1002", "0x0c0500")    # an AMD SMBus controller
    assert runtime.machine_runtime(SysRoot(str(tmp_path))) is cuda.RUNTIME


def test_without_libamdhip64_rocm_is_not_testable_with_the_loaders_reason(monkeypatch):
    monkeypatch.setattr(rocm, "library_error", lambda: "libamdhip64.so: cannot open shared object file")
    with pytest.raises(NotTestable, match="no ROCm runtime") as raised:
        rocm.RUNTIME.require_library()
    assert "cannot open shared object file" in raised.value.evidence


class HipResult(int):
    """A hipError_t as hip-python returns it: an int with a name."""

    def __new__(cls, value: int, name: str):
        result = super().__new__(cls, value)
        result.name = name
        return result


@pytest.mark.parametrize("result, error_class, exit_code", [
    (HipResult(100, "hipErrorNoDevice"), NotTestable, 9),
    (HipResult(2, "hipErrorOutOfMemory"), GpuOutOfMemory, 9),
    (HipResult(999, "hipErrorUnknown"), HipError, 6)])
def test_a_hip_result_is_the_error_it_means(result, error_class, exit_code):
    with pytest.raises(error_class) as raised:
        rocm.check((result, None), "hipMalloc(4096)")
    assert type(raised.value) is error_class and int(raised.value.exit_code) == exit_code
    assert f"hipMalloc(4096) returned {result.name}" in raised.value.cause
    assert rocm.check((HipResult(0, "hipSuccess"), 42), "hipGetDeviceCount()") == 42


def test_choosing_a_runtime_loads_no_bindings():
    """hip-python and cuda-python load only when a GPU is opened (cuda-bindings' own .pth
    file imports the empty ``cuda`` namespace at start-up: not the bindings)."""
    import subprocess
    import sys

    code = ("import sys\nfrom gdrprobe.memory import runtime\nruntime.runtimes()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'hip' or m.startswith('cuda.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=PACKAGE.parent)
    assert done.stdout.strip() == "[]", done.stderr


# ---- GDRPROBE_GPU_RUNTIME: where the bus cannot show the GPUs (issue 33: the lab's stand-in) --


def test_the_variable_names_the_runtime_whatever_the_bus_shows(tmp_path, monkeypatch):
    pci_function(tmp_path, "0000:3b:00.0", "0x10de", "0x030200")
    monkeypatch.setenv(runtime.RUNTIME_VARIABLE, "ROCm")
    assert runtime.machine_runtime(SysRoot(str(tmp_path))) is rocm.RUNTIME
    monkeypatch.setenv(runtime.RUNTIME_VARIABLE, "cuda")
    assert runtime.machine_runtime(SysRoot(str(tmp_path / "empty"))) is cuda.RUNTIME


def test_a_variable_naming_no_runtime_is_refused_before_anything_is_probed(monkeypatch):
    import gdrprobe
    from gdrprobe.errors import UsageError

    monkeypatch.setenv(runtime.RUNTIME_VARIABLE, "opencl")
    monkeypatch.setattr(runtime, "pci_functions", not_asked)
    monkeypatch.setattr(runtime, "machine_runtime", not_asked)
    with pytest.raises(UsageError, match="GDRPROBE_GPU_RUNTIME='opencl' names no GPU runtime") as raised:
        gdrprobe.check("0", token="t" * 16)
    assert raised.value.fix.startswith("set it to one of cuda, rocm")


# ---- a new runtime is one file set and one registry line (issue 42) ----------------------


@pytest.fixture
def third_runtime(monkeypatch, tmp_path):
    """The registry with one more line: the fake third runtime's module."""
    from tests.unit.fakes import third_runtime as third

    monkeypatch.setattr(runtime, "RUNTIME_MODULES", (*runtime.RUNTIME_MODULES, third.MODULE))
    monkeypatch.delenv(runtime.RUNTIME_VARIABLE, raising=False)
    pci_function(tmp_path, "0000:00:1f.0", "0x8086", "0x060100")       # Intel's bridge: no GPU
    pci_function(tmp_path, "0000:4d:00.0", "0x8086", f"0x{third.DISPLAY_CLASS:06x}")
    pci_function(tmp_path, "0000:4e:00.0", "0x8086", f"0x{third.DISPLAY_CLASS:06x}")
    return third


def test_the_memory_seam_opens_a_registered_runtimes_gpu(third_runtime, tmp_path, monkeypatch):
    assert runtime.machine_runtime(SysRoot(str(tmp_path))) is third_runtime.RUNTIME
    monkeypatch.setattr(runtime, "SysRoot", lambda: SysRoot(str(tmp_path)))
    with runtime.open_gpu("0000:4d:00.0") as gpu:
        assert gpu.bus_id == "0000:4d:00.0"
    assert third_runtime.OPENED[-1] == "0000:4d:00.0"
    monkeypatch.setenv(runtime.RUNTIME_VARIABLE, "Third")
    assert runtime.machine_runtime(SysRoot(str(tmp_path / "empty"))) is third_runtime.RUNTIME


def test_the_doctor_and_the_campaigns_ask_a_registered_runtime(third_runtime, tmp_path):
    from gdrprobe.campaign import machine
    from gdrprobe.doctor.facts.context import DoctorContext

    (tmp_path / third_runtime.LISTED_FILE.lstrip("/")).parent.mkdir(parents=True)
    (tmp_path / third_runtime.LISTED_FILE.lstrip("/")).write_text("0000:4d:00.0\n")
    ctx = DoctorContext(SysRoot(str(tmp_path)), {})
    # what a capture of the node kept of its live call, which a replay reads
    (tmp_path / third_runtime.FACTS_FILE.lstrip("/")).parent.mkdir(parents=True)
    (tmp_path / third_runtime.FACTS_FILE.lstrip("/")).write_text(json.dumps(third_runtime.collect(ctx)))
    assert ctx.runtime is third_runtime.RUNTIME and ctx.gpu_collector is third_runtime
    assert [gpu.bdf for gpu in ctx.topology.gpus] == ["0000:4d:00.0"]      # what its driver lists
    facts = machine.machine_facts(str(tmp_path), {})
    assert facts.gpus.runtime_bus_ids == ("0000:4d:00.0",)
    lost = next(f for f in facts.findings if f.id == "gpu.third")
    assert lost.status is Status.FAIL and "lost 0000:4e:00.0" in lost.summary
    with pytest.raises(GpuUnusable, match="the third runtime lost 0000:4e:00.0") as raised:
        machine.require_gpus(facts)
    assert int(raised.value.exit_code) == 11


# ---- the hip-python line is the node's ROCm release (issue 39 item 8) --------------------


class FakeHip:
    """hip-python's module as far as the line check asks it: HIP's runtime version."""

    def __init__(self, version: int | None):
        self.version = version

    def hipRuntimeGetVersion(self):
        if self.version is None:
            raise RuntimeError("hipRuntimeGetVersion is not in this runtime")
        return HipResult(0, "hipSuccess"), self.version


@pytest.mark.parametrize("installed", ["10.0.0.0.1.2", "7.2.2.562.43", "6.3.3.540.31"])
def test_a_hip_python_of_another_line_than_rocms_is_refused_with_the_line_to_install(installed):
    from gdrprobe.errors import MissingDependency

    with pytest.raises(MissingDependency, match=f"hip-python {installed} does not match the HIP "
                                                "runtime of ROCm 6.4") as raised:
        rocm.require_matching_line(FakeHip(60443483), installed)      # ROCm 6.4.1's HIP
    assert "pip install 'hip-python==6.4.*'" in raised.value.fix


@pytest.mark.parametrize("installed, version", [("6.4.1.552.39", 60443483), ("7.1.0.555.40", 70151831),
                                                ("10.0.0.0.1.2", None), (None, 60443483)])
def test_a_matching_line_or_nothing_to_compare_is_accepted(installed, version):
    rocm.require_matching_line(FakeHip(version), installed)
