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


# ---- fixtures several modules share (their fakes: tests/unit/fakes) ----------------------


@pytest.fixture
def runs(monkeypatch):
    """The runs a check makes, the run engine replaced by a recorder: (endpoint, options,
    local, remote) each; host arms near a 400 Gb/s port's line rate, GPU arms a little
    under."""
    from gdrprobe.measure import loopback
    from tests.unit.fakes.runs import recorded_run

    made = []

    def runner(options, endpoint, host=None, port=None, token=None, **ignored):
        def probe(local, remote):
            made.append((endpoint, options, local, remote))
            if local.kind == remote.kind == "host":
                return recorded_run(390.0, {"kind": "host"})
            return recorded_run(380.0, {"kind": "gpu", "mechanism": "dmabuf"})
        return probe

    monkeypatch.setattr(loopback, "runner", runner)
    return made


@pytest.fixture
def locks(tmp_path):
    """The NIC locks' directory of a check, in the test's own scratch directory."""
    return {"GDRPROBE_LOCK_DIR": str(tmp_path / "locks")}


@pytest.fixture
def api(monkeypatch):
    """gdrprobe.check and check_node replaced by recorders: the calls the CLI makes; check
    answers engaged, check_node one GPU not testable."""
    import gdrprobe
    from gdrprobe.report.check import NodeCheckReport, NodeGpuCheck
    from tests.unit.fakes.reports import engaged_report

    calls = []

    def check(**kwargs):
        calls.append(("check", kwargs))
        return engaged_report()

    def check_node(**kwargs):
        calls.append(("check_node", kwargs))
        return NodeCheckReport((NodeGpuCheck("0000:3b:00.0", "rxe0", 9, error="not testable: "
                                             "no CUDA driver"),), 30.0, 4.0, 9)

    monkeypatch.setattr(gdrprobe, "check", check)
    monkeypatch.setattr(gdrprobe, "check_node", check_node)
    return calls


@pytest.fixture
def engine(monkeypatch, tmp_path):
    """Recorders in place of the run engine, the server, the machine's facts and MPI
    (tests/unit/fakes/engine.py); the calls they recorded."""
    from tests.unit.fakes.engine import install_engine

    return install_engine(monkeypatch, tmp_path)


@pytest.fixture
def node(tmp_path):
    """deploy/slurm/gdrprobe-prolog.sh over fakes in a scratch directory: node(code) runs it
    with gdrprobe exiting code (tests/unit/fakes/prolog.py)."""
    from tests.unit.fakes.prolog import PrologNode

    return PrologNode(tmp_path)
