"""The GID NCCL uses on a RoCE port, by release (gdrprobe.nccl.gid; NVIDIA/nccl
src/transport/net_ib/connect.cc ncclIbGetGidIndex from 2.21.5, net_ib.cc before): the walk
of the table and the variables that steer it, and NCCL_IB_GID_INDEX's default of 0 (no walk)
before 2.21.5."""

from __future__ import annotations

import pytest

from gdrprobe.nccl import gid
from gdrprobe.nccl.versions import NcclRules
from tests.unit.fakes.gids import DUAL_STACK, GLOBAL_V6, IPV6_ONLY, LINK_LOCAL, V1, V2, V4_A, V4_B


@pytest.mark.parametrize("table, preference, expected", [
    (DUAL_STACK, gid.GidPreference(), 3),                          # IPv4, RoCE v2
    (DUAL_STACK, gid.GidPreference(roce_version=1), 2),
    (DUAL_STACK, gid.GidPreference(family=6), 5),                  # global IPv6, v2
    (IPV6_ONLY, gid.GidPreference(), 0),                           # no IPv4: index 0 stays
    (IPV6_ONLY, gid.GidPreference(family=6), 3),
    (DUAL_STACK + [(6, V4_B, V2)], gid.GidPreference(address_range="192.168.0.0/16"), 6),
    (DUAL_STACK + [(6, V4_B, V2)], gid.GidPreference(address_range="192.168.0.0"), 3),
    (DUAL_STACK, gid.GidPreference(address_range="fd00::/8"), 3),   # other family: ignored
])
def test_the_gid_nccl_picks(table, preference, expected):
    assert gid.nccl_gid_index(table, 256, preference) == expected


def test_an_empty_first_slot_is_read_as_nccl_reads_it():
    # Index 0 empty (family 6, not valid): the first IPv4 GID moves NCCL off it.
    assert gid.nccl_gid_index([(3, V4_A, V1), (4, V4_A, V2)], 16) == 4


def test_the_gid_family_and_validity_are_nccls():
    assert gid.gid_family(V4_A) == 4 and gid.gid_family(LINK_LOCAL) == 6
    assert gid.gid_family("ff0e:0000:0000:0000:0000:ffff:0a00:0001") == 4  # mapped multicast
    assert gid.gid_family(gid.ZERO_GID) == 6
    assert not gid.gid_valid(LINK_LOCAL) and not gid.gid_valid(gid.ZERO_GID)
    assert gid.gid_valid(V4_A) and gid.gid_valid(GLOBAL_V6)


@pytest.mark.parametrize("value, family", [("AF_INET6", 6), ("AF_INET", 4), ("", 4),
                                           ("af_inet6", 4), ("INET6", 4)])
def test_nccl_takes_only_af_inet6_exactly_for_ipv6(value, family):
    preference = gid.gid_preference({"NCCL_IB_ADDR_FAMILY": value})
    assert (preference.family, preference.roce_version, preference.address_range) == \
        (family, 2, None)


@pytest.mark.parametrize("version, environ, index", [
    ((2, 30, 7), {}, None),                               # -1: the walk
    ((2, 21, 5), {}, None),
    ((2, 20, 5), {}, 0),                                  # default 0: index 0, no walk
    ((2, 18, 3), {"NCCL_IB_GID_INDEX": "3"}, 3),
    ((2, 30, 7), {"NCCL_IB_GID_INDEX": "0x3"}, 3),        # strtoll base 0
    ((2, 30, 7), {"NCCL_IB_GID_INDEX": "-1"}, None),
])
def test_nccl_ib_gid_index_by_release(version, environ, index):
    assert gid.stated_gid_index(environ, NcclRules(version)) == index
    if index == 0 and not environ:
        assert "no walk before 2.21.5" in gid.why_stated(environ, NcclRules(version))


def test_before_2_21_5_the_walk_s_variables_are_not_read():
    older = gid.gid_preference({"NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ADDR_RANGE": "fd00::/8"},
                               NcclRules((2, 20, 5)))
    assert (older.family, older.address_range) == (4, None)
