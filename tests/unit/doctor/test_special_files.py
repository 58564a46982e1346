"""Files the environment or a capture names are opened without blocking, read only when they
are regular files, and their links followed as the kernel follows them (issue 43 items 2
and 6): NCCL_TOPO_FILE or NCCL_CONF_FILE naming a FIFO hung `doctor`, `check` and
`check --node` (in a prolog: "stuck", and the node drained); a topology file reached through
more than 40 links was reported loaded though the kernel, and so NCCL, refuses it; a link
loop was unbounded recursion (exit 70); an ELF offset of 2^63 or more was an OverflowError.
FIFOs and devices are made in the test's scratch directory, never under /dev."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from gdrprobe.doctor.facts import elf_dynamic
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import cloud_machines

LIMIT_S = 120      # a doctor run of the VM takes a few seconds here


def file_finding(report):
    (finding,) = [f for f in report.findings if f.id == "topology.nccl_file"]
    return finding


def chain(tree, links: int, target: str) -> str:
    """A chain of `links` absolute links inside the root, ending at target; its first link."""
    os.makedirs(tree.path("/links"))
    for index in range(links):
        os.symlink(f"/links/{index + 1}" if index + 1 < links else target, tree.path(f"/links/{index}"))
    return "/links/0"


@pytest.mark.parametrize("links, loaded", [(40, True), (41, False)])
def test_a_topology_file_through_more_than_40_links_is_not_loaded(tmp_path, links, loaded):
    tree = cloud_machines.ndv5_vm(tmp_path)
    tree.write("/shared/ndv5.xml", cloud_machines.ndv5_topology())
    report = run_doctor(str(tmp_path), environ={"NCCL_TOPO_FILE": chain(tree, links, "/shared/ndv5.xml")})
    finding = file_finding(report)
    assert (finding.status is Status.OK) == loaded, finding.summary
    if not loaded:
        assert "NCCL cannot open it (more than 40 symbolic links on the way (ELOOP))" in finding.summary


def test_a_topology_file_in_a_link_loop_is_no_crash(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    os.makedirs(tree.path("/loop"))
    os.symlink("/loop/b", tree.path("/loop/a"))
    os.symlink("/loop/a", tree.path("/loop/b"))
    report = run_doctor(str(tmp_path), environ={"NCCL_TOPO_FILE": "/loop/a"})
    assert not [f.id for f in report.findings if f.id.endswith(".crashed")]
    assert "more than 40 symbolic links" in file_finding(report).summary


def test_the_live_root_resolves_a_loop_to_eloop_not_recursion(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    root = SysRoot("/")
    with pytest.raises(OSError) as raised:
        root.realpath(str(tmp_path / "a"))
    assert raised.value.errno == 40
    assert root.read(str(tmp_path / "a")) is None
    assert root.resolve(str(tmp_path / "a")) == str(tmp_path / "a")


def test_a_topology_file_that_is_a_fifo_fails_the_node_without_hanging(tmp_path):
    """NCCL's fopen of a FIFO waits for a writer: every communicator's init hangs."""
    tree = cloud_machines.ndv5_vm(tmp_path)
    os.makedirs(tree.path("/shared"))
    os.mkfifo(tree.path("/shared/topo.xml"))
    report = run_doctor(str(tmp_path), environ={"NCCL_TOPO_FILE": "/shared/topo.xml"})
    finding = file_finding(report)
    assert finding.status is Status.FAIL
    assert "it is a FIFO, not a regular file: NCCL's fopen waits" in finding.summary
    assert finding.fix == "Point NCCL_TOPO_FILE at a regular file, or unset it."


def test_a_conf_file_that_is_a_fifo_is_not_read(tmp_path):
    tree = cloud_machines.ndv5_vm(tmp_path)
    os.makedirs(tree.path("/shared"))
    os.mkfifo(tree.path("/shared/nccl.conf"))
    ctx = DoctorContext(SysRoot(str(tmp_path)), {"NCCL_CONF_FILE": "/shared/nccl.conf"})
    assert ctx.environ == {"NCCL_CONF_FILE": "/shared/nccl.conf"}
    assert ctx.root.why_refused("/shared/nccl.conf") == "a FIFO"


@pytest.mark.parametrize("variable", ["NCCL_TOPO_FILE", "NCCL_CONF_FILE"])
@pytest.mark.parametrize("command", [["doctor"], ["check", "--quiet"], ["check", "--node", "--quiet"]],
                         ids=" ".join)
def test_the_live_commands_never_wait_on_a_fifo(tmp_path, variable, command):
    """On this machine, in a child bounded in time: a hang fails the test."""
    os.mkfifo(tmp_path / "fifo")
    done = subprocess.run([sys.executable, "-m", "gdrprobe", *command], capture_output=True, text=True,
                          env={**os.environ, variable: str(tmp_path / "fifo"),
                               "GDRPROBE_LOCK_DIR": str(tmp_path / "locks")},
                          timeout=LIMIT_S, stdin=subprocess.DEVNULL)
    assert done.returncode != 70, done.stdout + done.stderr


def test_a_character_device_is_never_opened(tmp_path):
    """A device node where a sysfs attribute belongs (made here: /dev/zero's numbers)."""
    try:
        os.mknod(tmp_path / "zero", 0o600 | 0o020000, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    root = SysRoot(str(tmp_path))
    assert root.read("/zero") is None
    assert root.why_refused("/zero") == "a character device"


def elf_with_dynamic_offset(offset: int) -> bytes:
    header = elf_dynamic.EHDR.pack(b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0,
                                   elf_dynamic.EHDR.size, 0, 0, elf_dynamic.EHDR.size,
                                   elf_dynamic.PHDR.size, 1, 0, 0, 0)
    dynamic = elf_dynamic.PHDR.pack(elf_dynamic.PT_DYNAMIC, 0, offset, 0, 0, 16, 16, 8)
    return header + dynamic


@pytest.mark.parametrize("offset", [(1 << 63) - 8, 1 << 63, (1 << 64) - 1])
def test_an_elf_offset_past_any_file_is_unreadable_not_a_crash(tmp_path, offset):
    (tmp_path / "libnccl.so.2").write_bytes(elf_with_dynamic_offset(offset))
    with pytest.raises(elf_dynamic.ElfUnreadable, match="past the end|cut short"):
        elf_dynamic.read_dynamic(SysRoot(str(tmp_path)), "/libnccl.so.2")


def test_the_elf_header_layout_is_what_the_reader_unpacks():
    assert struct.calcsize("<16sHHIQQQIHHHHHH") == elf_dynamic.EHDR.size == 64


def test_a_replay_never_opens_a_device_of_this_machine(tmp_path):
    """A capture holds an empty regular file where the machine had /dev/infiniband/uverbs0;
    a link there to an absolute path leads inside the capture, and a FIFO or a device is
    refused, never opened read-write."""
    import errno

    dev = tmp_path / "dev/infiniband"
    dev.mkdir(parents=True)
    (dev / "uverbs0").write_text("")
    os.symlink("/dev/null", dev / "uverbs1")           # the host's /dev/null, were it followed
    os.mkfifo(dev / "uverbs2")
    root = SysRoot(str(tmp_path))
    root.try_open_device("/dev/infiniband/uverbs0")
    with pytest.raises(FileNotFoundError):
        root.try_open_device("/dev/infiniband/uverbs1")
    with pytest.raises(OSError) as refused:
        root.try_open_device("/dev/infiniband/uverbs2")
    assert refused.value.errno == errno.EINVAL and "a FIFO" in refused.value.strerror
