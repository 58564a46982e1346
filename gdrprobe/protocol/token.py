"""The run's token: how a server makes one, and which tokens a person may choose.

Whoever captures one handshake (an eavesdropper, or a fake server a client was pointed
at) can test guesses at the token offline: each guess costs one scrypt (handshake.py), and
the salt is fresh for every handshake, so each captured handshake costs its own guesses.
The floor a token must clear comes from that attack, not from a count of characters:

- A token is a key: NIST SP 800-131A Rev. 2 (section 1.2.2) allows no key of under 112
  bits of security strength, and SP 800-57 Part 1 Rev. 5 (Table 4) holds 112 bits
  acceptable through 2030. (SP 800-63B section 5.1.1 asks only 8 characters of a password
  because the verifier throttles online guesses and keeps its hashes to itself; a captured
  handshake is an offline attack, where that does not hold.)
- Each guess costs one scrypt with N=2^15, r=8, p=1: 2N BlockMix calls of 2r Salsa20/8
  cores, 2^20 core evaluations in 32 MiB (RFC 7914 sections 4 and 5). We credit that work
  with 20 of the 112 bits, and nothing for its memory.
- So a token must carry at least 112 - 20 = 92 bits: 16 random characters from the 64 of
  'gdrprobe serve''s tokens, 20 random letters and digits, 23 random hexadecimal digits.

No count of characters can measure what a person chose: a token is judged by the most it
could carry, as if each character were drawn at random from the classes it uses (lower
case, upper case, digits, anything else). A token under the floor is refused; one over it
is only as strong as the way it was drawn, which is why 'gdrprobe serve' draws 144 random
bits and why a chosen token must be drawn at random too.
"""

from __future__ import annotations

import math
import secrets
import string

SECURITY_STRENGTH_BITS = 112    # SP 800-131A Rev. 2: the least strength a key may have
SCRYPT_WORK_BITS = 20           # log2 of the Salsa20/8 cores of one guess (RFC 7914)
FLOOR_BITS = SECURITY_STRENGTH_BITS - SCRYPT_WORK_BITS
MAX_TOKEN_CHARS = 256
GENERATED_BYTES = 18            # 144 random bits, 24 URL-safe characters
# Character classes and their sizes; any character outside the first three counts as one
# of the 33 printable ASCII symbols (space included).
CLASSES = ((string.ascii_lowercase, 26), (string.ascii_uppercase, 26), (string.digits, 10))
OTHER_CLASS = 33
TOKEN_FIX = ("use the token 'gdrprobe serve' prints, or draw one at random: python3 -c "
             "'import secrets; print(secrets.token_urlsafe(18))'")


def new_token() -> str:
    """24 URL-safe characters, 144 random bits; always over the floor (one drawn from too
    few classes to show it, a chance under 2^-60, is drawn again), and never starting with
    "-", which a command line would take for an option (`--token -x...`: argparse's
    "expected one argument"; 1 in 64 draws, drawn again)."""
    while (token_bits(token := secrets.token_urlsafe(GENERATED_BYTES)) < FLOOR_BITS
           or token.startswith("-")):
        pass
    return token


def token_bits(token: str) -> float:
    """The most a token can carry: its length times log2 of the classes it uses."""
    alphabet = sum(size for chars, size in CLASSES if any(ch in chars for ch in token))
    if any(not any(ch in chars for chars, _ in CLASSES) for ch in token):
        alphabet += OTHER_CLASS
    return len(token) * math.log2(alphabet) if alphabet else 0.0


def token_problem(token: str) -> str | None:
    """Why a token is refused (not UTF-8, too long, under the floor), or None."""
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        return ("the token is not valid UTF-8 text (it holds bytes that are no character "
                "in UTF-8)")
    if len(token) > MAX_TOKEN_CHARS:
        return f"the token has {len(token)} characters; at most {MAX_TOKEN_CHARS} are taken"
    bits = token_bits(token)
    if bits < FLOOR_BITS:
        return (f"the token can carry at most {math.floor(bits)} bits ({len(token)} "
                f"characters of the classes it uses); a token needs {FLOOR_BITS}, since "
                "whoever captures one handshake can test guesses at it offline "
                "(SECURITY.md, 'The token')")
    return None
