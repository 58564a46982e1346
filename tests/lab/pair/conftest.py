"""Host a's side of the two-host suite: host b (10.77.0.2) runs the lab agent."""

import time

import pytest

from lab.agent import AgentClient

HOST_B = "10.77.0.2"


@pytest.fixture(scope="session")
def host_b():
    deadline = time.monotonic() + 120   # host b may still be booting
    while True:
        try:
            client = AgentClient(HOST_B)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    yield client
    client.call("shutdown")
    client.close()
