import pytest

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
