"""The verbs platform as NCCL meets it, on real verbs in the guest: a RoCE port with no IPv4
GID, a device this process cannot open, and a DMA-BUF registered through libibverbs where
pyverbs cannot (rxe refuses DMA-BUF: EOPNOTSUPP is the path's answer here)."""

import contextlib
import errno
import json
import os
import stat
import subprocess

import pytest

from gdrprobe.rdma import verbs
from gdrprobe.rdma.dmabuf import ROUTE, register_dmabuf
from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions
from gdrprobe.rdma.handles import pd_pointer
from tests.lab.helpers import gdrprobe, rdma_resources

IPV6_ONLY = "fd00::1/64"


def sh(command: str) -> None:
    subprocess.run(["sh", "-c", command], check=True, timeout=60)


@contextlib.contextmanager
def ipv6_only_device():
    """rxe1 on a dummy interface with an IPv6 address and no IPv4 one."""
    sh(f"modprobe dummy && ip link add dum0 type dummy && ip link set dum0 up && "
       f"ip -6 addr add {IPV6_ONLY} dev dum0 && rdma link add rxe1 type rxe netdev dum0")
    try:
        sh("for i in $(seq 100); do grep -q '^fd00:' /sys/class/infiniband/rxe1/ports/1/gids/* "
           "2>/dev/null && exit 0; sleep 0.1; done; exit 1")
        yield "rxe1"
    finally:
        sh("rdma link delete rxe1; ip link del dum0")


def test_an_ipv6_only_roce_port_runs_in_loopback_with_the_gid_nccl_picks(baseline):
    with ipv6_only_device() as device:
        done = gdrprobe("run", "--loopback", "-d", device, "-n", "20", "--json", timeout=600)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        local = report["local"]
        # NCCL's walk of this table stays at index 0, the link-local GID (no IPv4 GID).
        assert local["gid_index"] == 0 and local["gid"].startswith("fe80:")
        assert any("the GID NCCL picks" in note for note in local["notes"])
        assert report["bandwidth"][0]["integrity"]["bad_bytes"] == 0
    assert rdma_resources() == baseline


def free_char_major() -> int:
    """A character major no driver has: opening a node of it fails with ENXIO."""
    with open("/proc/devices") as listed:
        taken = {int(line.split()[0]) for line in listed if line.split()[:1] and
                 line.split()[0].isdigit()}
    # The majors Documentation/admin-guide/devices.txt keeps for local use first.
    local_use = [*range(60, 64), *range(120, 128), *range(240, 255), *range(1, 512)]
    return next(major for major in local_use if major not in taken)


@contextlib.contextmanager
def unopenable_node(node: str = "uverbs0"):
    """/dev/infiniband/NODE replaced by a node no driver answers: libibverbs still lists
    the device (it only stats the node), and opening it fails as it would in a container
    whose device cgroup denies it."""
    path, saved = f"/dev/infiniband/{node}", f"/dev/infiniband/.{node}.saved"
    os.rename(path, saved)
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(free_char_major(), 0))
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.rename(saved, path)


def test_a_device_this_process_cannot_open_is_skipped_and_named(baseline):
    with unopenable_node() as path:
        listing = gdrprobe("devices", "--json")
        assert listing.returncode == 0, listing.stderr
        report = json.loads(listing.stdout)
        assert report["devices"] == []
        assert report["skipped"] == [f"rxe0: {path}: No such device or address"]
        chosen = gdrprobe("run", "--loopback", "-n", "10")
        assert chosen.returncode == 4 and "no RDMA device can be opened" in chosen.stderr
        named = gdrprobe("run", "--loopback", "-d", "rxe0", "-n", "10")
        assert named.returncode == 4, named.stderr
        assert f"RDMA device rxe0 cannot be opened ({path}: No such device or address)" in \
            named.stderr
        assert "Traceback" not in named.stderr + chosen.stderr
    assert rdma_resources() == baseline


def test_libibverbs_itself_registers_a_dmabuf_on_pyverbs_pd(baseline):
    """Where pyverbs' DmaBufMR takes no fd (rdma-core 34 to 43) gdrprobe calls
    ibv_reg_dmabuf_mr on the PD pyverbs owns; rxe answers EOPNOTSUPP, as it does pyverbs."""
    pv = verbs.pyverbs()
    fd = os.memfd_create("gdrprobe-lab-dmabuf")
    try:
        with Endpoint(EndpointOptions(), "127.0.0.1") as endpoint:
            assert pd_pointer(endpoint.pd) > 0            # located and checked
            for descriptor in (fd, -1):                   # a file, and NCCL's probe's -1
                with pytest.raises(pv.PyverbsRDMAError) as raised:
                    register_dmabuf(endpoint.pd, 4096, 3, descriptor, 0)
                assert raised.value.error_code == errno.EOPNOTSUPP
                assert raised.value.route == ROUTE
            with pytest.raises(pv.PyverbsRDMAError) as through_pyverbs:
                pv.mr.DmaBufMR(endpoint.pd, 4096, 3, dmabuf=fd, offset=0)
            assert through_pyverbs.value.error_code == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    assert rdma_resources() == baseline
