"""What every unit test may count on, whatever started pytest.

A shell's background job (`cmd &`) and nohup start Python with SIGINT ignored, and Python
then installs no handler of its own: a test that interrupts itself (os.kill with SIGINT, as
a Ctrl-C would) would see nothing happen and wait forever. A parent may also hand down a
signal mask that blocks SIGINT. So each test runs with Python's own Ctrl-C handling, and
whatever was there before is put back after it.
"""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True)
def ctrl_c_raises_keyboard_interrupt():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        # None: a handler installed outside Python, which signal.signal cannot put back
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


@pytest.fixture(autouse=True)
def no_rdma_nic_on_the_live_bus(monkeypatch):
    """The A/B's "no RDMA device" answer reads the PCI bus for an RDMA NIC without its driver
    (campaign/ab.py no_device_not_testable). A unit test never depends on the machine that
    runs it: the live bus (root "/") counts as having no such NIC; a test's own root is read."""
    from gdrprobe.campaign import ab

    real = ab.rdma_nics_without_device
    monkeypatch.setattr(ab, "rdma_nics_without_device",
                        lambda root: [] if root.root == "/" else real(root))
