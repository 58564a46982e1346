"""--max-buffer bounds all the memory a client's run makes the server allocate, its
registered buffer and its queues, and a refusal names both and the number the run needed."""

from __future__ import annotations

import pytest

from gdrprobe.errors import PeerError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.server import MIN_MAX_BUFFER, PREFLIGHT_BYTES, ProbeServer, queue_bytes
from gdrprobe.rdma.endpoint import EndpointOptions

TOKEN = "token-1234567890abcdef"


@pytest.fixture
def server():
    def start(max_buffer: int) -> ProbeServer:
        started.append(ProbeServer(TOKEN, EndpointOptions(), bind="127.0.0.1", port=0,
                                   max_buffer=max_buffer, preflight=False))
        return started[-1]

    started = []
    yield start
    for each in started:
        each.close()


def test_queues_are_counted_as_the_providers_size_them():
    # 128 send entries: 256 slots of 256 bytes, 2 receive slots; a CQ of 256 x 128 bytes.
    assert queue_bytes(EndpointOptions(num_qps=1, tx_depth=128)) == 258 * 256 + 256 * 128
    # 220 bytes of inline data: entries of 512 bytes.
    assert queue_bytes(EndpointOptions(num_qps=1, tx_depth=1, max_inline=220)) == \
        (2 + 2) * 512 + 4 * 128


def test_the_smallest_run_fits_the_smallest_max_buffer():
    smallest = ProbeOptions(sizes=(1,), iterations=1, tx_depth=1)
    needed = PREFLIGHT_BYTES + queue_bytes(smallest.endpoint_options(EndpointOptions(), True))
    assert smallest.buffer_bytes == PREFLIGHT_BYTES and needed <= MIN_MAX_BUFFER


def test_a_run_whose_queues_alone_exceed_max_buffer_is_refused(server):
    """A tiny buffer but 64 QPs of 16384 entries: half a GiB of queues."""
    options = ProbeOptions(sizes=(64,), iterations=100000, qps=64, tx_depth=16384)
    with pytest.raises(PeerError) as caught:
        server(256 << 20)._checked_options(options.to_message())
    queues = queue_bytes(options.endpoint_options(EndpointOptions(), server=True))
    needed = options.buffer_bytes + queues
    assert queues > 256 << 20
    assert f"the run needs {needed} bytes on the server and its --max-buffer is " \
        f"{256 << 20}" in caught.value.cause
    assert f"{options.buffer_bytes} bytes of registered buffer" in caught.value.cause
    assert f"up to {queues} bytes of queues (64 QP(s) of 16384 send entries" in \
        caught.value.cause
    assert f"--max-buffer {needed} or more" in caught.value.fix


def test_a_message_as_large_as_max_buffer_is_refused_with_the_number_it_needs(server):
    """-s 65536 against --max-buffer 65536: the slots of the size, not one message."""
    options = ProbeOptions(sizes=(65536,))
    with pytest.raises(PeerError, match="registered buffer") as caught:
        server(65536)._checked_options(options.to_message())
    queues = queue_bytes(options.endpoint_options(EndpointOptions(), server=True))
    assert f"--max-buffer {options.buffer_bytes + queues} or more" in caught.value.fix


def test_a_run_within_max_buffer_is_taken(server):
    options = ProbeOptions(sizes=(4096,), iterations=10)
    assert server(256 << 20)._checked_options(options.to_message()) == options
