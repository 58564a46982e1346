"""A server whose GPU buffer failed sends its doctor findings with the error, so the
client's verdict can confirm or rule out causes on the host that owns the buffer."""

from gdrprobe.campaign import verdict
from gdrprobe.errors import RegistrationFailed
from gdrprobe.protocol.channel import error_from_message
from gdrprobe.protocol.messages import error_with_findings, findings_in
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Finding, Status

ACS = Finding(ids.ACS_BRIDGE, ids.ACS, Status.FAIL, "ACS redirects peer traffic on 0000:1a:00.0",
              fix="setpci ...")


def test_a_registration_error_carries_the_owners_findings_across_the_wire():
    refused = RegistrationFailed("registering GPU memory through peermem failed", "modprobe",
                                 "errno 14", 14, "peermem")
    message = {"type": "error", **error_with_findings(refused, [ACS])}
    rebuilt = error_from_message(message, "server")
    assert isinstance(rebuilt, RegistrationFailed) and rebuilt.error_code == 14
    (finding,) = findings_in(rebuilt)
    assert (finding.id, finding.status, finding.summary) == (ACS.id, Status.FAIL, ACS.summary)
    assert verdict.speaks_to_verdict(finding.id)      # the server sends it: the verdict names it


def test_errors_without_findings_or_with_malformed_ones_carry_none():
    plain = error_from_message({"type": "error", "reason": "no GPU", "category": "NotTestable"},
                               "server")
    assert findings_in(plain) == ()
    broken = error_from_message({"type": "error", "reason": "x", "findings": [{"id": 3}]},
                                "server")
    assert findings_in(broken) == ()
    assert findings_in(RegistrationFailed("local", "", "", 14, "dmabuf")) == ()
