"""Package-level promises: light imports, a working CLI, documented exit codes."""

import subprocess
import sys

from tests.unit.machine import no_rdma_device_only


def run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_import_loads_neither_pyverbs_nor_cuda_nor_numpy():
    # Measured against what the interpreter loaded before: cuda-bindings 12.x installs a
    # .pth file that imports the (empty) cuda namespace package at every start-up.
    loaded = run_python(
        "import sys; before = set(sys.modules); import gdrprobe; import gdrprobe.cli;"
        " gdrprobe.cli.build_parser();"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in"
        " ('pyverbs', 'cuda', 'numpy')))")
    assert loaded == "[]"


@no_rdma_device_only
def test_devices_without_rdma_exits_with_no_device_code():
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "devices"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 4
    assert "no RDMA device found" in done.stderr
    assert "fix:" in done.stderr


def test_bad_flag_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "devices", "--bogus"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
