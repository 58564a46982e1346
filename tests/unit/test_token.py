"""The token policy (a floor in bits, from the offline attack a captured handshake allows)
and the inputs that once ended in a traceback: each is now a usage error (exit 2) naming
the cause and the fix, before anything is sent or opened."""

from __future__ import annotations

import math

import pytest

import gdrprobe
from gdrprobe.cli import main
from gdrprobe.protocol import handshake as hs
from gdrprobe.protocol import token as policy

STRONG = "token-1234567890abcdef"
NOT_UTF8 = "token-\udcff1234567890abcdef"      # what argv or the environment make of 0xff


def test_the_floor_comes_from_the_key_strength_and_the_scrypt_work():
    # RFC 7914: ROMix runs 2N BlockMix calls, each of 2r Salsa20/8 cores.
    assert 2 * hs.KDF_N * 2 * hs.KDF_R == 1 << policy.SCRYPT_WORK_BITS
    assert policy.FLOOR_BITS == policy.SECURITY_STRENGTH_BITS - policy.SCRYPT_WORK_BITS == 92


@pytest.mark.parametrize("token, bits", [
    ("a" * 20, 20 * math.log2(26)),
    ("0123456789abcdef0123", 20 * math.log2(36)),
    ("Aa0-" * 4, 16 * math.log2(26 + 26 + 10 + 33)),
    ("", 0.0),
])
def test_a_token_is_judged_by_the_most_it_could_carry(token, bits):
    assert policy.token_bits(token) == pytest.approx(bits)


def test_every_generated_token_clears_the_floor():
    tokens = {policy.new_token() for _ in range(2000)}
    assert len(tokens) == 2000
    assert all(len(token) == 24 and policy.token_problem(token) is None for token in tokens)
    assert gdrprobe.token_warning(gdrprobe.new_token()) is None


@pytest.mark.parametrize("token, words", [
    ("short-token!", "at most 70 bits"),     # 12 characters of 26 + 33
    ("password1234", "a token needs 92"),
    ("x" * 300, "at most 256"),
    (NOT_UTF8, "not valid UTF-8"),
])
def test_a_weak_long_or_broken_token_is_refused_with_the_reason(token, words):
    assert words in gdrprobe.token_warning(token)
    with pytest.raises(gdrprobe.UsageError, match="token") as caught:
        gdrprobe.run("127.0.0.1", token=token)
    assert "token_urlsafe" in caught.value.fix


@pytest.fixture
def no_doctor(monkeypatch):
    """serve's findings come from the doctor; these tests end before they are needed."""
    from gdrprobe.campaign import machine

    monkeypatch.setattr(machine, "served_findings", lambda: ())


@pytest.mark.parametrize("argv, words", [
    (["run", "127.0.0.1", "--token", NOT_UTF8], "not valid UTF-8"),
    (["serve", "--token", NOT_UTF8], "not valid UTF-8"),
    (["run", "127.0.0.1", "--token", "short-token!"], "a token needs 92"),
    (["serve", "--token", "short-token!"], "a token needs 92"),
    (["serve", "--bind", "localhost"], "--bind 'localhost' is not an IP address"),
    (["serve", "--bind", "a" * 64 + ".example"], "is not an IP address"),
    (["run", "a" * 64 + ".example", "--token", STRONG], "is not a host name"),
    (["run", "a..example", "--token", STRONG], "is not a host name"),
])
def test_inputs_that_once_raised_a_traceback_are_usage_errors(no_doctor, capsys, argv, words):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_a_new_token_never_reads_as_an_option():
    """1 draw in 64 started with "-": `gdrprobe run HOST --token <it>` was argparse's
    "expected one argument" (issue 41's walkthrough met it)."""
    from gdrprobe.protocol.token import new_token

    assert not any(new_token().startswith("-") for _ in range(2000))
