"""A line rate read in one place (gdrprobe.doctor.facts.pci.line_rate_gbps): the doctor's
rails sum a NIC's ports, the check's floor and rails take the one port they measure, and
both count only a rate the kernel states."""

from __future__ import annotations

import pytest

from gdrprobe.campaign.gate import GpuFacts, MachineFacts, PortFacts
from gdrprobe.campaign.prelaunch import floor_check
from gdrprobe.doctor.facts.pci import line_rate_gbps
from gdrprobe.nccl.topo import Port

NIC = "mlx5_0"


def facts(*rates: float | None) -> MachineFacts:
    """A machine whose NIC has one port per rate (port 1, 2, ...)."""
    ports = {(NIC, number): PortFacts(rate, "InfiniBand") for number, rate in enumerate(rates, 1)}
    return MachineFacts(GpuFacts((), ()), {}, ports=ports)


@pytest.mark.parametrize("rates, expected", [
    ((400.0,), 400.0),
    ((200.0, 200.0), 400.0),            # a dual-port NIC: its ports together
    ((200.0, None), 200.0),             # a port the kernel states nothing for adds nothing
    ((0.0, 100.0), 100.0),              # nor one that states 0
    ((None,), None), ((0.0,), None), ((), None),
])
def test_a_line_rate_is_the_stated_rates_summed_and_none_where_none_is_stated(rates, expected):
    assert line_rate_gbps([Port(number, "4: ACTIVE", rate) for number, rate in enumerate(rates, 1)]) == expected


def test_the_check_reads_each_port_alone_as_the_doctor_reads_it():
    machine = facts(200.0, 100.0)
    assert (machine.line_rate(NIC, 1), machine.line_rate(NIC, 2), machine.line_rate(NIC, 3)) == (200.0, 100.0, None)
    assert machine.line_rate(NIC, 1) == line_rate_gbps([machine.ports[(NIC, 1)]])


def test_the_floor_applies_to_the_measured_ports_stated_rate():
    floor = floor_check(NIC, 2, facts(200.0, 100.0), 0.5)
    assert floor.applied and floor.line_rate_gbps == 100.0
    assert floor.note == "0.50 of 100 Gb/s = 50 Gb/s"


@pytest.mark.parametrize("rate", [None, 0.0])
def test_a_port_stating_no_rate_gets_no_floor_and_says_so(rate):
    floor = floor_check(NIC, 1, facts(rate), 0.5)
    assert not floor.applied and floor.line_rate_gbps is None and floor.software_device is False
    assert floor.note == f"not applied: the kernel states no line rate for {NIC} port 1"
