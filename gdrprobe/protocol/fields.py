"""Checked fields of a peer's message: present, of the right type, within bounds.

Every value a peer sends passes through these before it is used, so a malformed or hostile
message ends as a :class:`PeerError` naming the field, never as a traceback.
"""

from __future__ import annotations

import math

from gdrprobe.errors import PeerError, is_hidden

# What a person does about a peer whose message this gdrprobe cannot take: a peer of another
# version, or one that is not gdrprobe at all.
SAME_VERSION_FIX = "run the same gdrprobe version on both hosts"
PEER_TEXT_CHARS = 200
PEER_NUMBER_CHARS = 24   # a number a peer sent, as it is quoted back: cut past this


def field(message: dict, name: str, kind: type, *, low=None, high=None, default=...):
    """A checked field of a peer's message: present, of the right type, within bounds."""
    if name not in message:
        if default is not ...:
            return default
        raise PeerError(f"peer message {peer_text(message.get('type'), 40)!r} lacks {name!r}",
                        SAME_VERSION_FIX)
    value = message[name]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        expected = getattr(kind, "__name__", "number")
        raise PeerError(f"peer message field {name!r} is not a {expected}", SAME_VERSION_FIX)
    if isinstance(value, float) and not math.isfinite(value):
        raise PeerError(f"peer message field {name!r} is not a finite number", SAME_VERSION_FIX)
    if kind is str and len(value) > 4096:
        raise PeerError(f"peer message field {name!r} is too long", SAME_VERSION_FIX)
    if low is not None and value < low or high is not None and value > high:
        raise PeerError(f"peer message field {name!r}={peer_number(value)} is outside "
                        f"[{low}, {high}]", SAME_VERSION_FIX)
    return value


def int_list(message: dict, name: str, *, low: int, high: int, max_items: int) -> list[int]:
    values = field(message, name, list)
    if not 1 <= len(values) <= max_items:
        raise PeerError(f"peer message field {name!r} has {len(values)} items "
                        f"(1 to {max_items} allowed)", SAME_VERSION_FIX)
    return [field({name: v}, name, int, low=low, high=high) for v in values]


def peer_text(value, limit: int = PEER_TEXT_CHARS) -> str:
    """Text an authenticated peer sent, safe to log or show: every character that could
    forge a line or hide text (:func:`gdrprobe.errors.is_hidden`: newlines too) shown as '?', and at most
    `limit` characters, so a peer can neither forge lines of our output nor flood it. A
    stranger's text (a peer that has not proved the token) is never shown at all."""
    text = value if isinstance(value, str) else "" if value is None else repr(value)
    cut = len(text) > limit
    text = "".join("?" if is_hidden(ch) else ch for ch in text[:limit])
    return text + "..." if cut else text


def peer_number(value) -> str:
    """A number a peer sent, as an error quotes it: whole when short, else its first digits
    and its length (Python prints ints of up to 4300 digits)."""
    text = str(value)
    if len(text) <= PEER_NUMBER_CHARS:
        return text
    return f"{text[:PEER_NUMBER_CHARS]}... ({len(text)} characters)"
