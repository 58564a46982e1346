import os
import subprocess

import pytest

from lab.dmabuf_guest import GUEST_SCRIPT
from lab.modules import built_modules
from tests.lab.helpers import Server, rdma_resources

TOKEN = "lab-token-0123456789"


@pytest.fixture
def baseline():
    """The guest's verbs resources before a test: the kernel's own QP, CQ and PD."""
    return rdma_resources()


@pytest.fixture
def server():
    running = Server(TOKEN, timeout=5.0)
    yield running
    running.stop()


# ---- the lab's dma-buf modules (docs/dmabuf-lab.md), loaded for a module's tests ----------


def guest_script(*args: str) -> None:
    done = subprocess.run(["bash", GUEST_SCRIPT, *args], capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        pytest.skip(f"the lab's dma-buf modules cannot load here: {done.stderr.strip()}")


@pytest.fixture(scope="module")
def modules():
    if not os.path.exists("/sys/class/infiniband/rxe0") or os.geteuid() != 0:
        pytest.skip("needs a lab guest (rxe0, root)")
    built = built_modules(os.uname().release)
    if built is None:
        pytest.skip("the lab's dma-buf modules are not built for this kernel: run "
                    "'python -m lab.modules' on the host")
    guest_script("load", built.folder)
    yield built
    guest_script("restore")
