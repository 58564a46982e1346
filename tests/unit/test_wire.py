"""What a peer sends about its endpoint and buffer is checked before verbs sees it, and
every message of a run is built and parsed in one place and goes on the wire unchanged."""

import dataclasses
import socket

import pytest

from gdrprobe.errors import PeerError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.channel import HEADER, Channel
from gdrprobe.protocol.messages import (Done, Queued, Received, RemoteBuffer, Setup, SetupOk, Start,
                                        Verified, address_from_message, address_message,
                                        integrity_from_message, send)
from gdrprobe.rdma.endpoint import EndpointAddress
from gdrprobe.report.model import EndpointSummary, Finding, Integrity, Status

GOOD = {"gid": "0000:0000:0000:0000:0000:ffff:0a4d:0002", "lid": 0, "mtu": 4096,
        "qp_numbers": [17, 18], "psns": [1, 2], "read_credits": 16}


def test_a_good_address():
    address = address_from_message(GOOD)
    assert address.qp_numbers == (17, 18) and address.mtu == 4096
    assert address.read_credits == 16


@pytest.mark.parametrize("change", [
    {"mtu": 1000}, {"mtu": "4096"}, {"gid": "not-a-gid"}, {"gid": 7}, {"lid": 1 << 20},
    {"qp_numbers": [1 << 24]}, {"psns": [-1]}, {"qp_numbers": list(range(1, 100))},
    {"read_credits": 0}, {"read_credits": 256},
])
def test_a_bad_address_is_a_peer_error(change):
    with pytest.raises(PeerError):
        address_from_message(GOOD | change)


@pytest.mark.parametrize("change", [{"mtu": 10 ** 4000}, {"lid": 10 ** 4000},
                                    {"qp_numbers": [10 ** 4000]}])
def test_a_huge_number_from_a_peer_is_quoted_cut(change):
    with pytest.raises(PeerError) as caught:
        address_from_message(GOOD | change)
    assert len(caught.value.cause) < 120 and "(4001 characters)" in caught.value.cause


def test_buffer_and_integrity_bounds():
    assert RemoteBuffer.from_message({"address": 4096, "rkey": 5, "length": 8192}).rkey == 5
    with pytest.raises(PeerError):
        RemoteBuffer.from_message({"address": -1, "rkey": 5, "length": 8192})
    verified = {"bytes_checked": 10, "bad_bytes": 1, "first_bad_offset": 3, "stray_bytes": 0,
                "first_stray_offset": -1, "messages_checked": 4, "messages_total": 20,
                "bad_messages": 1}
    report = integrity_from_message(verified)
    assert report.first_bad_offset == 3 and report.first_stray_offset is None and not report.ok
    assert report.coverage == "checked the last 4 of 20 messages"
    for bad in ({"messages_checked": 21}, {"bad_messages": 5 * 10}, {"messages_total": 0}):
        with pytest.raises(PeerError):
            integrity_from_message(verified | bad)


@pytest.mark.parametrize("gid", ["::1", "fe80::1", "0000:0000:0000:0000:0000:ffff:0a4d:02",
                                 "0000:0000:0000:0000:0000:ffff:0a4d:000g",
                                 "0000:0000:0000:0000:0000:ffff:0a4d:0002:0000"])
def test_a_gid_verbs_would_refuse_is_refused_here(gid):
    """pyverbs' GID() takes 8 groups of 4 hex digits only; '::1' passes ipaddress."""
    with pytest.raises(PeerError, match="form verbs takes"):
        address_from_message(GOOD | {"gid": gid})


# ---- every message of a run: built and parsed in one place, on the wire unchanged ----------

GID = GOOD["gid"]
ADDRESS = EndpointAddress(gid=GID, gid_index=-1, lid=0, mtu=4096, qp_numbers=(17,), psns=(5,))
BUFFER = RemoteBuffer(address=4096, rkey=7, length=8192)
SUMMARY = EndpointSummary(host="b", device="rxe0", port=1, gid_index=1, gid=GID,
                          mtu_bytes=1024, qp_numbers=(17,), memory={"kind": "host"})
ACS = Finding("acs.bridge", "acs", Status.FAIL, "ACS redirects peer traffic", fix="setpci ...")
CLEAN = Integrity(checked=True, bytes_checked=640, bad_bytes=0, first_bad_offset=None,
                  stray_bytes=0, first_stray_offset=None, messages_checked=10,
                  messages_total=10, bad_messages=0)
ECHO = Integrity(checked=True, bytes_checked=63, bad_bytes=1, first_bad_offset=5,
                 stray_bytes=0, first_stray_offset=None, messages_total=100, bad_messages=1)


@dataclasses.dataclass(frozen=True)
class Block:
    """A settings or memory block as its owner (a layer above protocol) would carry it."""

    body: dict

    @property
    def endpoint_qps(self) -> int:
        return self.body["qps"]

    def to_message(self) -> dict:
        return self.body


SETTINGS = Block({"mode": "bandwidth", "qps": 1})

# Each message with its parser's context, and its body exactly as gdrprobe sends it (the
# bytes the lab's peers and older builds of this protocol version exchange).
MESSAGES = [
    (Setup(SETTINGS, ADDRESS, None, None), {"read_settings": Block, "read_memory": Block},
     '{"type":"setup","settings":{"mode":"bandwidth","qps":1},"endpoint":{"gid":"' + GID +
     '","lid":0,"mtu":4096,"qp_numbers":[17],"psns":[5],"read_credits":1},"buffer":null,"server_memory":null}'),
    (Setup(SETTINGS, ADDRESS, BUFFER, Block({"kind": "host"})),
     {"read_settings": Block, "read_memory": Block},
     '{"type":"setup","settings":{"mode":"bandwidth","qps":1},"endpoint":{"gid":"' + GID +
     '","lid":0,"mtu":4096,"qp_numbers":[17],"psns":[5],"read_credits":1},"buffer":{"address":4096,'
     '"rkey":7,"length":8192},"server_memory":{"kind":"host"}}'),
    (Queued(2, "10.0.0.1", 1.5), {},
     '{"type":"queued","position":2,"running":"10.0.0.1","running_s":1.5}'),
    (SetupOk(ADDRESS, BUFFER, SUMMARY, 30.0, (ACS,)),
     {"max_qps": 1, "timeout_bounds": (5.0, 3600.0)},
     '{"type":"setup_ok","endpoint":{"gid":"' + GID + '","lid":0,"mtu":4096,'
     '"qp_numbers":[17],"psns":[5],"read_credits":1},"buffer":{"address":4096,"rkey":7,"length":8192},'
     '"summary":{"host":"b","device":"rxe0","port":1,"gid_index":1,"gid":"' + GID + '",'
     '"mtu_bytes":1024,"qp_numbers":[17],"memory":{"kind":"host"}},"timeout_s":30.0,'
     '"findings":[{"id":"acs.bridge","group":"acs","status":"fail",'
     '"summary":"ACS redirects peer traffic","fix":"setpci ..."}]}'),
    (Setup(SETTINGS, ADDRESS, None, None, BUFFER), {"read_settings": Block, "read_memory": Block},
     '{"type":"setup","settings":{"mode":"bandwidth","qps":1},"endpoint":{"gid":"' + GID +
     '","lid":0,"mtu":4096,"qp_numbers":[17],"psns":[5],"read_credits":1},"buffer":null,'
     '"server_memory":null,"fifo":{"address":4096,"rkey":7,"length":8192}}'),
    (Start(64, 3), {"max_size": 64}, '{"type":"start","size":64,"round":3}'),
    (Start(64, 3, "nccl", 96), {"max_size": 64},
     '{"type":"start","size":64,"round":3,"pattern":"nccl","first_step":96}'),
    (Received(64, 1000, 90, 80, 5, 700, 6, 72, 0), {},
     '{"type":"received","steps":64,"elapsed_ns":1000,"alone_step_ns":90,"alone_recv_ns":80,'
     '"alone_flush_ns":5,"loaded_step_ns":700,"loaded_flush_ns":6,"flush_reads":72,'
     '"flush_bad":0}'),
    (Done(10), {"bandwidth": True}, '{"type":"done","messages":10}'),
    (Done(), {"bandwidth": False}, '{"type":"done"}'),
    (Verified(CLEAN, 0.25), {"bandwidth": True},
     '{"type":"verified","bytes_checked":640,"bad_bytes":0,"first_bad_offset":-1,'
     '"stray_bytes":0,"first_stray_offset":-1,"messages_checked":10,"messages_total":10,'
     '"bad_messages":0,"stage_in_s":0.25}'),
    (Verified(ECHO), {"bandwidth": False},
     '{"type":"verified","bytes_checked":63,"bad_bytes":1,"first_bad_offset":5,'
     '"stray_bytes":0,"first_stray_offset":-1,"messages_checked":1,"messages_total":100,'
     '"bad_messages":1}'),
]
IDS = [f"{message.KIND}-{i}" for i, (message, _, _) in enumerate(MESSAGES)]


@pytest.fixture
def channels():
    left, right = socket.socketpair()
    a, b = Channel(left, 2.0, "server"), Channel(right, 2.0, "client")
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("message, context, body", MESSAGES, ids=IDS)
def test_each_message_round_trips_through_its_builder_and_parser(channels, message, context,
                                                                  body):
    a, b = channels
    send(a, message)
    assert type(message).from_message(b.receive(message.KIND), **context) == message


@pytest.mark.parametrize("message, context, body", MESSAGES, ids=IDS)
def test_each_message_goes_on_the_wire_as_it_always_has(channels, message, context, body):
    a, _ = channels
    assert a.frame(message.KIND, **message.to_message())[HEADER.size:] == body.encode()


def test_setup_carries_the_settings_and_memory_blocks_their_owners_read():
    setup = Setup(ProbeOptions(sizes=(64, 4096), qps=2),
                  dataclasses.replace(ADDRESS, qp_numbers=(17, 18), psns=(5, 6)),
                  BUFFER, MemorySpec.from_choice("dmabuf"))
    message = {"type": "setup", **setup.to_message()}
    assert Setup.from_message(message, ProbeOptions.from_message,
                              MemorySpec.from_message) == setup
    one_qp = message | {"settings": ProbeOptions(sizes=(64,)).to_message()}
    with pytest.raises(PeerError, match="qp_numbers"):   # more QPs than the settings say
        Setup.from_message(one_qp, ProbeOptions.from_message, MemorySpec.from_message)


@pytest.mark.parametrize("kind, change, context", [
    (Start, {"size": 65}, {"max_size": 64}),
    (Start, {"round": -1}, {"max_size": 64}),
    (Queued, {"position": 0}, {}),
    (Done, {"messages": -1}, {"bandwidth": True}),
    (Done, {"messages": None}, {"bandwidth": True}),
    (Verified, {"stage_in_s": -0.5}, {"bandwidth": True}),
    (SetupOk, {"timeout_s": 1.0}, {"max_qps": 1, "timeout_bounds": (5.0, 3600.0)}),
])
def test_a_bad_field_in_a_message_is_a_peer_error(kind, change, context):
    message, _, _ = next(entry for entry in MESSAGES if type(entry[0]) is kind)
    wire = {"type": kind.KIND, **message.to_message()} | change
    with pytest.raises(PeerError):
        kind.from_message(wire, **context)


def test_an_address_with_more_psns_than_qps_is_refused():
    with pytest.raises(PeerError, match="2 QP numbers and 3 PSNs"):
        address_from_message(GOOD | {"psns": [1, 2, 3]})
    assert address_from_message(address_message(ADDRESS)) == ADDRESS
