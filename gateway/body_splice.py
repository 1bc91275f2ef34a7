"""A large body parsed with where each top-level member lies in the client's bytes, so what the
gateway changes (model renamed, stream_options, max_tokens clamped, cache_salt, priority taken
out) is spliced into those bytes rather than the whole body serialised again.

json.dumps of a 200 KB chat body costs about 0.4 ms on the event loop (more for non-ASCII text,
which it escapes); the splice copies the client's bytes and serialises only the members that
changed. The parse is json's own: the top-level object is walked member by member here, and
each member's value is read by the same C scanner (with the same duplicate-name hook) that
parses every other body. Anything this walk does not accept as it stands is parsed again by
`parse_json_object`, so which bodies are refused, and how, cannot differ.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from gateway.request_body import (
    DECODER,
    DuplicateMember,
    check_surrogates,
    decoded,
    parse_json_object,
    unique_members,
)

# A member as it came: its name, its first and past-its-last byte in the client's body, and the
# value it had when parsed (what the gateway may replace).
Member = tuple[str, int, int, Any]

# json's own: what it skips between tokens.
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]


def parse_with_members(raw: bytes) -> tuple[dict[str, Any], tuple[Member, ...] | None]:
    """`parse_json_object(raw)` and, where the walk read the body as it stands, each top-level
    member's place in `raw` (None where it did not: the body is then as parse_json_object
    found it, or refused as it refuses it)."""
    text = decoded(raw)
    found = _walk(text)
    if found is None:
        return parse_json_object(raw), None
    body, places = found
    check_surrogates(raw, body)
    return body, _in_bytes(raw, text, places, body)


def _walk(text: str) -> tuple[dict[str, Any], list[tuple[str, int, int]]] | None:
    """The top-level object's members and each one's (name, start, end) in `text`, as json's
    JSONObject reads them; None for anything else (an error, another type, extra data)."""
    ws = _skip
    scan: Callable[[str, int], tuple[Any, int]] = DECODER.scan_once  # type: ignore[attr-defined]
    try:
        at = ws(text, 0)
        if text[at : at + 1] != "{":
            return None
        at = ws(text, at + 1)
        pairs: list[tuple[str, Any]] = []
        places: list[tuple[str, int, int]] = []
        if text[at : at + 1] != "}":
            while True:
                if text[at : at + 1] != '"':
                    return None
                start = at
                name, at = _scanstring(text, at + 1, True)
                at = ws(text, at)
                if text[at : at + 1] != ":":
                    return None
                value, at = scan(text, ws(text, at + 1))
                pairs.append((name, value))
                places.append((name, start, at))
                at = ws(text, at)
                mark = text[at : at + 1]
                at = ws(text, at + 1)
                if mark == "}":
                    break
                if mark != ",":
                    return None
        else:
            at = ws(text, at + 1)
        if at != len(text):
            return None
        return unique_members(pairs), places
    except (ValueError, StopIteration, RecursionError, DuplicateMember):
        return None


def _skip(text: str, at: int) -> int:
    found = _WHITESPACE.match(text, at)
    assert found is not None  # it matches the empty string
    return found.end()


def _in_bytes(
    raw: bytes, text: str, places: list[tuple[str, int, int]], body: dict[str, Any]
) -> tuple[Member, ...]:
    """Places in `text` as places in `raw`: the same for ASCII; else counted in UTF-8 from one
    place to the next (one pass, in C), after the BOM if the body had one."""
    # As many characters as bytes: every byte decoded alone, so all are ASCII and there was no
    # BOM. Two lengths, where raw.isascii() read the whole body (7 us for 200 KB).
    if len(text) == len(raw):
        return tuple((name, start, end, body[name]) for name, start, end in places)
    offset = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    members = []
    done = 0  # characters of `text` counted so far, `offset` bytes
    for name, start, end in places:
        offset += _utf8_length(text, done, start)
        first = offset
        offset += _utf8_length(text, start, end)
        done = end
        members.append((name, first, offset, body[name]))
    return tuple(members)


def _utf8_length(text: str, start: int, end: int) -> int:
    # `text` is the body's strict UTF-8 decoded: it encodes back to the very same bytes.
    piece = text[start:end]
    return len(piece) if piece.isascii() else len(piece.encode())


def spliced(raw: bytes, members: tuple[Member, ...], body: dict[str, Any]) -> bytes:
    """`body` as bytes, its members in its own order as json.dumps would write them: each one
    the client sent and the gateway left as it was (the very same object) as the client's
    bytes, each one it replaced or added serialised; those it took out are gone."""
    sent = {name: (start, end, value) for name, start, end, value in members}
    parts: list[bytes] = []
    for name, now in body.items():
        place = sent.get(name)
        if place is not None and place[2] is now:
            parts.append(raw[place[0] : place[1]])
        else:
            parts.append(_member(name, now))
    return b"{" + b",".join(parts) + b"}"


def _member(name: str, value: Any) -> bytes:
    return json.dumps({name: value}, separators=(",", ":")).encode()[1:-1]
