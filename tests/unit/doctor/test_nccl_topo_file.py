"""NCCL's topology file read as NCCL reads it (NVIDIA/nccl 2.30.7 src/graph/xml.cc: the
parser xmlGetNode/xmlGetToken/xmlGetValue/xmlLoadSub and the handlers ncclTopoXmlLoad*;
topo.cc ncclTopoGetSystem for which file) and the place it gives a device (xml.cc
ncclTopoFillGpu, ncclTopoFillNet, ncclTopoGetPciNode, ncclTopoGetXmlFromSys). Before issue
28 no such reader existed: the doctor placed every device from sysfs."""

from __future__ import annotations

import pytest

from gdrprobe.nccl.topo_file import (MAX_FILE_BYTES, VIRTUAL_TOPOLOGY_FILE, OversizedFile, TopoFileError,
                                     parse_topology, place_device, topo_file_setting)
from tests.unit.doctor import cloud_machines

NEW, OLD = (2, 30, 7), (2, 20, 5)


def wrapped(inner: str, cpu: str = 'numaid="0"') -> str:
    return f'<system version="1">\n  <cpu {cpu}>\n{inner}\n  </cpu>\n</system>\n'


def error_of(text: str, version=NEW) -> TopoFileError:
    with pytest.raises(TopoFileError) as raised:
        parse_topology(text, version)
    return raised.value


def test_the_azure_layout_is_read_element_by_element():
    xml = parse_topology(cloud_machines.ndv5_topology(), NEW)
    assert [e.name for e in xml.elements[:5]] == ["system", "cpu", "pci", "pci", "pci"]
    assert len(xml.elements) == 1 + 2 + 8 * 3
    switch = xml.pci("ffff:ff:05.0")
    assert switch.parent.attrs["numaid"] == "1"
    assert switch.attrs["link_speed"] == "32.0 GT/s PCIe" and switch.attrs["vendor"] == "0x0000"
    assert [sub.attrs["busid"] for sub in switch.subs] == ["0009:00:00.0", "0105:00:00.0"]


@pytest.mark.parametrize("text, message", [
    # NCCL's parser knows no declaration: "?" is where it expects ">".
    ('<?xml version="1.0"?>\n' + wrapped(""), "XML Parse : expected >, got '?'"),
    # Only blanks separate attributes; a tab ends the element where ">" is expected.
    (wrapped('<pci busid="0001:00:00.0"\tclass="0x0302"/>'), "XML Parse : expected >, got '\t'"),
    (wrapped('<pci busid=0001:00:00.0/>'), "XML Parse : Expected (double) quote."),
    (wrapped("text"), "XML Parse error : expecting '<', got 't'"),
    (wrapped('<pci busid="a"></gpu>'), "XML Mismatch : pci / gpu"),
    ('<system version="1"><cpu numaid="0">', "XML Parse : unterminated cpu"),
    (wrapped("<!-- no end"), "XML Parse error : unterminated comment"),
    (wrapped("").replace('version="1"', ""), "Attribute version of node system not found"),
])
def test_what_nccls_parser_rejects_fails_with_its_message(text, message):
    error = error_of(text)
    assert (error.message, error.result) == (message, "ncclInternalError")


def test_a_wrong_version_is_invalid_usage():
    error = error_of(wrapped("").replace('version="1"', 'version="2"'))
    assert (error.message, error.result) == ("XML Topology has wrong version 2, 1 needed", "ncclInvalidUsage")
    assert parse_topology(wrapped("").replace('version="1"', 'version="0x1"'), NEW).has_system


def test_single_quotes_are_read_from_2_27_3_only():
    text = wrapped("<pci busid='0001:00:00.0' class='0x030200'/>")
    assert parse_topology(text, (2, 27, 3)).pci("0001:00:00.0").attrs["class"] == "0x030200"
    assert error_of(text, (2, 26, 6)).message == "XML Parse : Expected (double) quote."


def test_entities_are_never_expanded():
    """No DTD, no entity: "&amp;" stays five characters and a DOCTYPE is an element NCCL skips
    until it meets text it cannot read."""
    xml = parse_topology(wrapped('<pci busid="&amp;x;" class="&lt;"/>'), NEW)
    assert xml.pci("&amp;x;").attrs["class"] == "&lt;"
    doctype = '<!DOCTYPE system [<!ENTITY x "0001:00:00.0">]>\n' + wrapped('<pci busid="&x;"/>')
    assert error_of(doctype).message == "XML Parse error : expecting '<', got ']'"


def test_comments_and_unknown_elements_are_skipped_with_what_they_hold():
    text = wrapped('<!----><!-- <pci busid="0002:00:00.0"/> --><foo><pci busid="0003:00:00.0"></bar></foo>'
                   '<pci busid="0001:00:00.0"/>')
    xml = parse_topology(text, NEW)
    assert [e.attrs.get("busid") for e in xml.elements if e.name == "pci"] == ["0001:00:00.0"]


def test_names_and_values_are_cut_at_nccls_buffer():
    assert parse_topology(wrapped(f'<pci busid="{"a" * 253}"/>'), NEW).pci("a" * 253)
    assert error_of(wrapped(f'<pci busid="{"a" * 254}"/>')).message.endswith("too long (max 255)")
    seventeen = " ".join(f'k{i}="{i}"' for i in range(17))
    assert "k16" not in parse_topology(wrapped(f"<pci {seventeen}/>"), NEW).elements[2].attrs


def test_the_element_limits_are_the_releases():
    """256 elements from 2.21.5 (1024 before); 32 children per element before 2.21.5."""
    many = wrapped('<pci busid="a"/>' * 254)
    assert error_of(many).message == "Error : XML parser is limited to 256 nodes"
    assert error_of(many, OLD).message == "Error : XML parser is limited to 32 subnodes"
    assert len(parse_topology(wrapped('<pci busid="a"/>' * 253), NEW).elements) == 255


def test_the_input_is_bounded_and_an_empty_file_is_no_topology():
    with pytest.raises(OversizedFile):
        parse_topology("<!--" + " " * MAX_FILE_BYTES + "-->", NEW)
    assert not parse_topology("", NEW).has_system
    assert not parse_topology("<!-- nothing -->\n<other/>\n", NEW).has_system


# ---- which file ------------------------------------------------------------------------------


def test_which_file_nccl_reads():
    named = topo_file_setting({"NCCL_TOPO_FILE": "/opt/t.xml"}, "/etc/nccl.conf", NEW)
    assert (named.path, named.named, named.describe()) == (
        "/opt/t.xml", True, "/opt/t.xml (NCCL_TOPO_FILE in /etc/nccl.conf)")
    # Set, even empty, it is the only file NCCL tries.
    assert topo_file_setting({"NCCL_TOPO_FILE": ""}, "environment", NEW).path == ""
    default = topo_file_setting({}, "environment", NEW)
    assert (default.path, default.named) == (VIRTUAL_TOPOLOGY_FILE, False)
    assert topo_file_setting({}, "environment", (2, 9, 9)) is None


# ---- where a device goes ---------------------------------------------------------------------


def test_a_device_the_file_names_keeps_the_files_parents():
    xml = parse_topology(cloud_machines.ndv5_topology(), NEW)
    gpu = place_device(xml, "000a:00:00.0", (), set())
    assert (gpu.parents, gpu.numaid, gpu.own["link_width"]) == (("ffff:ff:06.0",), "1", "16")
    assert gpu.from_file["ffff:ff:06.0"]["class"] == "0x060400"
    # Bus ids are compared as NCCL prints them (lower case): an upper-case file names nothing.
    assert place_device(xml, "000A:00:00.0", (), set()) is None


def test_a_device_the_file_does_not_name_climbs_sysfs_into_the_files_switch():
    xml = parse_topology(wrapped('    <pci busid="ffff:ff:00.0" class="0x060400">\n'
                                 '      <pci busid="0000:19:00.0" class="0x060400"/>\n    </pci>', 'numaid="1"'), NEW)
    placed = place_device(xml, "0000:1b:00.0", ("0000:1a:00.0", "0000:19:00.0"), {"0000:19:00.0"})
    assert (placed.parents, placed.numaid, placed.own) == (("0000:1a:00.0", "0000:19:00.0", "ffff:ff:00.0"), "1", {})
    assert placed.describe() == ("under 0000:1a:00.0, then 0000:19:00.0, then ffff:ff:00.0, CPU numaid 1 "
                                 "(matched by switch 0000:19:00.0 above it in sysfs)")
    assert place_device(xml, "0000:3b:00.0", ("0000:39:00.0",), set()) is None


def test_a_nic_whose_net_is_in_the_file_sits_where_the_net_sits():
    xml = parse_topology(wrapped('<nic><net name="mlx5_ib3"/></nic><pci busid="ffff:ff:01.0" class="0x060400">'
                                 '<pci busid="0000:a0:00.0"><nic><net name="mlx5_ib0"/></nic></pci></pci>'), NEW)
    on_cpu = place_device(xml, "0104:00:00.0", (), set(), net_name="mlx5_ib3")
    assert (on_cpu.parents, on_cpu.numaid) == ((), "0")
    nic = place_device(xml, "0101:00:00.0", (), set(), net_name="mlx5_ib0")
    assert (nic.parents, nic.own["busid"]) == (("ffff:ff:01.0",), "0000:a0:00.0")


def test_what_nccls_init_needs_of_the_parents():
    """A parent switch needs a class (from sysfs where its bus id is a device there), a CPU
    its numaid (topo.cc ncclTopoAddPci, ncclTopoAddCpu)."""
    no_class = parse_topology(wrapped('<pci busid="ffff:ff:01.0"><pci busid="0001:00:00.0"/></pci>'), NEW)
    with pytest.raises(TopoFileError, match="Attribute class of node pci not found"):
        place_device(no_class, "0001:00:00.0", (), set())
    assert place_device(no_class, "0001:00:00.0", (), {"ffff:ff:01.0"}).parents == ("ffff:ff:01.0",)
    no_numa = parse_topology(wrapped('<pci busid="0001:00:00.0"/>', 'affinity="ff"'), NEW)
    with pytest.raises(TopoFileError, match="Attribute numaid of node cpu not found"):
        place_device(no_numa, "0001:00:00.0", (), set())
