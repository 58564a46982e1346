"""A replayed capture is checked by shape before any check reads it, and says which file is
damaged (issue 43 item 4; issue 41 item 4: an environ.json cut short replayed a FAIL as
"[ OK ] nccl.env"); files the capture names are read without blocking and links followed as
the kernel follows them (issue 43 item 2: a FIFO at a GPU's numa_node or /proc/cmdline hung
the doctor; /sys/class/infiniband/mlx5_0 linked to itself crashed it). Special files are made
in the test's scratch directory; the replays that could hang run in a child with a limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gdrprobe.cli import main
from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.capture_shape import DamagedCapture
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report.model import Status
from tests.unit.doctor import nccl_machines

CAPTURE = "gdrprobe-capture"
GPU = "0000:1b:00.0"
REPLAY_LIMIT_S = 120      # a replay of a small machine takes about a second here


@pytest.fixture
def captured(tmp_path):
    """A capture of a healthy two-pair node whose job sets NCCL_IB_DISABLE=1 (a FAIL)."""
    nccl_machines.pix_pairs(tmp_path / "node", pairs=2)
    dest = tmp_path / "capture"
    capture(str(dest), root=str(tmp_path / "node"), environ={"NCCL_IB_DISABLE": "1",
                                                             "HOME": "/root"})
    return dest


def statuses(report) -> dict[str, Status]:
    return {finding.id: finding.status for finding in report.findings}


def test_the_capture_replays_its_failure(captured):
    assert statuses(run_doctor(str(captured)))["nccl.ib_disable"] is Status.FAIL


def test_an_environ_cut_short_is_a_damaged_capture_not_an_ok(captured, capsys):
    """Issue 41: the cut file read as no environment, and the FAIL as "[ OK ] nccl.env"."""
    path = captured / CAPTURE / "environ.json"
    path.write_bytes(path.read_bytes()[:-5])
    assert main(["doctor", "--root", str(captured)]) == 2
    out, err = capsys.readouterr()
    assert "[ OK ]" not in out
    assert err.startswith(f"gdrprobe: error: the capture is damaged: {CAPTURE}/environ.json: ")
    assert "fix: capture the machine again" in err


@pytest.mark.parametrize("text, said", [
    ('["NCCL_IB_DISABLE=1"]', "the document is a list, not an object"),
    ('"NCCL_IB_DISABLE=1"', "the document is a string, not an object"),
    ('{"NCCL_IB_DISABLE": 1}', "'NCCL_IB_DISABLE' is a whole number, not a string"),
    ('{"NCCL_IB_DISABLE": null}', "'NCCL_IB_DISABLE' is null, not a string"),
    ('{"NCCL_IB_DISABLE": "1\\u0000"}', "NCCL_IB_DISABLE holds a NUL"),
    ('{"NCCL\\u0000X": "1"}', "is not an environment variable's name"),
    ('{"": "1"}', "is not an environment variable's name"),
    ("[" * 200_000 + "]" * 200_000, "nest more than 64 deep"),
    ('{"a": NaN}', "NaN is not a number JSON allows"),
    (b"\xff\xfe{}", "it is not UTF-8"),
])
def test_an_environ_of_another_shape_names_the_file(captured, text, said):
    path = captured / CAPTURE / "environ.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DamagedCapture) as raised:
        run_doctor(str(captured))
    assert f"{CAPTURE}/environ.json: " in raised.value.cause and said in raised.value.cause
    assert raised.value.exit_code == 2


@pytest.mark.parametrize("name, document, said", [
    ("cuda.json", [], "the document is a list, not null or an object"),
    ("cuda.json", {"gpus": {"0": {}}}, "gpus is an object, not a list"),
    ("cuda.json", {"gpus": [{"name": "H100"}]}, "gpus[0] lacks 'pci_bus_id'"),
    ("cuda.json", {"gpus": [{"pci_bus_id": GPU, "dma_buf_supported": "yes"}]},
     "gpus[0].dma_buf_supported is a string"),
    ("cuda.json", {"driver_version": True}, "driver_version is true or false"),
    ("nvml.json", {"driver_version": "570"}, "lacks 'gpus'"),
    ("nvml.json", {"gpus": [{"pci_bus_id": GPU, "bar1_total_bytes": "128G"}]},
     "gpus[0].bar1_total_bytes is a string"),
    ("nvml.json", {"gpus": [], "common_ancestor": {GPU: "PIX"}}, "is a string, not an object"),
    ("nics.json", {"dmabuf_probe": {"mlx5_0": 9}}, "dmabuf_probe.'mlx5_0' is a whole number"),
    ("nics.json", {"data_direct": {"devices": {"mlx5_0": {"path": 3}}}},
     "data_direct.devices.'mlx5_0'.path is a whole number"),
    ("nccl.json", {"site_packages": "/usr/lib/python3/dist-packages"},
     "site_packages is a string, not a list"),
    ("nccl.json", {"elf_dynamic": {"/lib/libnccl.so.2": {"needed": [1]}}},
     "elf_dynamic.'/lib/libnccl.so.2'.needed[0] is a whole number"),
])
def test_every_capture_file_of_another_shape_names_the_file(captured, name, document, said):
    (captured / CAPTURE / name).write_text(json.dumps(document))
    with pytest.raises(DamagedCapture) as raised:
        run_doctor(str(captured))
    assert f"{CAPTURE}/{name}: " in raised.value.cause and said in raised.value.cause


def test_an_amd_nodes_rocm_json_of_another_shape_names_the_file(tmp_path):
    from tests.unit.doctor import rocm_machines

    tree = rocm_machines.mi300x_node(tmp_path)
    tree.write(f"/{CAPTURE}/rocm.json", json.dumps({"hsa": []}))
    with pytest.raises(DamagedCapture, match="rocm.json: hsa is a list, not an object"):
        run_doctor(str(tmp_path), environ={})


def test_a_capture_file_that_is_a_fifo_or_a_link_loop_is_damaged(captured):
    os.unlink(captured / CAPTURE / "cuda.json")
    os.mkfifo(captured / CAPTURE / "cuda.json")
    with pytest.raises(DamagedCapture, match="cuda.json: it is a FIFO, not a regular file"):
        run_doctor(str(captured))
    os.unlink(captured / CAPTURE / "cuda.json")
    os.symlink("cuda.json", captured / CAPTURE / "cuda.json")
    with pytest.raises(DamagedCapture, match=r"cuda.json: it is more than 40 symbolic links"):
        run_doctor(str(captured))


def test_a_capture_lacking_an_optional_file_still_replays(captured):
    for name in ("nics.json", "nvml.json", "nccl.json"):
        os.unlink(captured / CAPTURE / name)
    assert statuses(run_doctor(str(captured)))["nccl.ib_disable"] is Status.FAIL


# ---- the machine's own files in a capture -------------------------------------------------


def replay(root, *flags: str) -> subprocess.CompletedProcess:
    """The doctor on a replay in a child, bounded in time: a hang fails the test, not the run."""
    return subprocess.run([sys.executable, "-m", "gdrprobe", "doctor", "--root", str(root), *flags],
                          capture_output=True, text=True, timeout=REPLAY_LIMIT_S,
                          stdin=subprocess.DEVNULL)


def crashed(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if ".crashed" in line]


def test_a_fifo_at_a_numa_node_and_at_the_kernel_command_line_does_not_hang(captured):
    for path in (f"sys/bus/pci/devices/{GPU}/numa_node", "proc/cmdline"):
        target = captured / path
        target = target.parent / os.readlink(target) if target.is_symlink() else target
        os.replace(target, str(target) + ".kept")
        os.mkfifo(target)
    done = replay(captured)
    assert done.returncode == 1 and crashed(done) == [], done.stdout + done.stderr


def test_an_rdma_device_linked_to_itself_is_no_crash(captured):
    link = captured / "sys/class/infiniband/mlx5_0"
    os.unlink(link)
    os.symlink("mlx5_0", link)
    done = replay(captured)
    assert done.returncode == 1 and crashed(done) == [], done.stdout + done.stderr


@pytest.mark.parametrize("content", ["9" * 5000, "\u00b2\u2028\ufffe", "-", "0x", ""])
def test_every_file_of_the_machine_rewritten_is_no_crash(captured, content):
    """Each file the capture copied from the machine (not its own JSON), its numbers and text
    replaced by what no kernel writes: the doctor answers, it never crashes."""
    for folder, _, names in os.walk(captured):
        if CAPTURE in folder:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path) and name not in ("config", "vendor", "class", "device"):
                with open(path, "w") as handle:
                    handle.write(content)
    done = replay(captured)
    assert done.returncode in (0, 1) and crashed(done) == [], done.stdout + done.stderr
