"""Tables print what the report holds, in perftest's shapes."""

from gdrprobe.report.text import rate, render_run
from tests.unit.fakes.runs import recorded_run
def test_rates_keep_their_digits_when_small():
    assert rate(0.000566) == "0.000566"
    assert rate(12.3456) == "12.35"


def test_bandwidth_table_rows():
    text = render_run(recorded_run(97.5, {"kind": "host"}), gbits=True)
    assert "BW average[Gb/sec]" in text
    row = [line for line in text.splitlines() if line.startswith(" 8388608")][0]
    assert row.split()[:4] == ["8388608", "100", "97.50", "97.50"] and row.endswith("ok 1/1")
