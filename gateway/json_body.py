"""A request body's JSON, read once: by orjson where the gateway can tell that it read the body
exactly as json would have, else by json with a hook that refuses a repeated name, which gives
every refusal.

orjson reads a 200 KB chat body in 85 to 110 us where json with the hook takes 180 to 350
(bench/gateway/large.py's bodies; docs/benchmarks.md), and a 250-byte one in 0.85 against 3.9
(the checks below bring that one's whole reading to 4.5 us, json's to 5.3). But it keeps the
last of a repeated name, where the gateway must refuse the body; it reads an integer past 64
bits as a float; and it refuses some bodies json reads (NaN, a BOM, nesting past 1,024). So
orjson's tree stands only where
- it is an object, nested at most FAST_DEPTH deep (json's own limit is the interpreter's
  recursion limit less the frames above it, so it refuses some depths orjson reads);
- no float in it is as large as 2**63 (where an integer orjson cannot hold as one went);
- no name was dropped, which the bytes tell: in valid JSON a colon outside a string ends a
  member's name. Where the bytes hold as many colons as the tree holds names, no string holds
  one and no name was dropped. Else orjson writes the tree back (a colon after each name, each
  colon of its strings as it is), and where the bytes write no colon as a `\\u003a` escape,
  the bytes' colons less the writing's are the dropped names and the colons of what they held:
  none where both count alike. `_same_names` says how the escape is ruled out.
Everything else is read again by json, so which bodies are refused, and how, is as before
(tests/unit/test_json_body.py compares the two on random and hostile bodies).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from itertools import repeat
from typing import Any

import orjson

from gateway.errors import bad_request

# How much of a repeated name an error shows (the length of a model name).
SHOWN_NAME = 256
# Far below json's own limit (about 1,000 less the frames above the parse) and far above any
# OpenAI body's nesting (a tool's JSON schema nests a few dozen levels at most).
FAST_DEPTH = 200
# Integers past 64 bits come back from orjson as floats; no float that large stands.
_LARGEST_INT_FLOAT = 2.0**63
_BOM = b"\xef\xbb\xbf"
# count_byte: from this size, a copy of the body costs more than a few calls of `find`; past
# this many of the byte, they cost more than the copy.
FIND_FROM_BYTES = 32 * 1024
FIND_AT_MOST = 8


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object, or the ApiError that says why not."""
    return read_json_object(raw)[0]


def read_json_object(raw: bytes) -> tuple[dict[str, Any], bool]:
    """`raw` as a JSON object, and whether orjson read it (then orjson writes it back as it
    came: json may have read NaN or Infinity, which orjson writes as null)."""
    body = read_fast(raw)
    if body is not None:
        return body, True
    return _read_strictly(raw), False


def read_fast(raw: bytes, budget: int = sys.maxsize) -> dict[str, Any] | None:
    """orjson's reading of `raw` where it is json's too (the module's docstring), else None;
    None also for a tree of more than `budget` items (a list's values, an object's members)."""
    data = raw[3:] if raw.startswith(_BOM) else raw
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if type(body) is not dict:
        return None
    shape = _names_and_strings(body, budget)
    if shape is None:
        return None
    names, strings = shape
    colons = count_byte(data, b":")
    if colons != names and not _same_names(data, body, colons, strings):
        return None
    return body


def count_byte(data: bytes, byte: bytes, limit: int = -1) -> int:
    """How many times `byte` is in `data`, counting stopped at `limit` (-1: none). By deleting
    them: bytes.count reads a byte at a time, replace jumps from one to the next with memchr
    (gateway/body_parse.py, STRUCTURAL_BYTES, has the measures). But replace then copies what
    it keeps, so in a large body the first few are found with `find` (memchr too, no copy),
    and a byte as rare as that is counted without the copy."""
    if len(data) >= FIND_FROM_BYTES:
        find = data.find
        found, at = 0, find(byte)
        while at >= 0 and found != limit and found < FIND_AT_MOST:
            found += 1
            at = find(byte, at + 1)
        if at < 0 or found == limit:  # all of them, or as many as asked
            return found
    return len(data) - len(data.replace(byte, b"", limit))


def _same_names(raw: bytes, body: dict[str, Any], colons: int, strings: list[str]) -> bool:
    """Whether `raw`'s objects hold no name that `body`'s dropped, where its strings hold
    colons (or a name was dropped); False may also mean "not found out".

    orjson writes `body` back with a colon after each name and each colon of its strings as it
    is, so where `raw` writes no colon as `\\u003a`, raw's colons less the written body's are
    the names dropped plus the colons of what they held: none, exactly when both count alike.

    No `\\u003a`: where raw has no backslash, it has no escape at all. Else orjson writes each
    string with the fewest backslashes a writer may use (one before a quote or a control
    character, two for a backslash), so where no string holds a backslash (one written
    `\\u005c` would take one fewer) and raw holds as many backslashes as the written body, it
    escapes nothing else: no `\\u003a`, and no dropped member holding one. Failing that, a
    five-byte search, which reads about 2 GB/s (0.1 ms for 200 KB).

    First of all, bytes that are the written body itself (as httpx, so the OpenAI SDK for
    Python, writes a body, floats aside) drop nothing."""
    written = orjson.dumps(body)
    if raw == written:
        return True
    if colons != count_byte(written, b":"):
        return False
    if b"\\" not in raw:
        return True
    no_backslash_held = not any(map(str.__contains__, strings, repeat("\\")))
    if no_backslash_held and count_byte(raw, b"\\") == count_byte(written, b"\\"):
        return True
    return b"\\u003" not in raw


def _names_and_strings(
    body: dict[str, Any], budget: int = sys.maxsize
) -> tuple[int, list[str]] | None:
    """How many names the tree's objects hold, and its strings (names among them); None for a
    tree nested past FAST_DEPTH, holding a float as large as 2**63, or of more than `budget`
    items (a list's values and an object's members, each counted once). A level at a time, so
    the depth is counted without a step per value."""
    names = 0
    strings: list[str] = []
    keep = strings.append
    level: list[Any] = [body]
    depth = 0
    while level:
        depth += 1
        if depth > FAST_DEPTH:
            return None
        below: list[Any] = []
        for container in level:
            budget -= len(container)
            if budget < 0:
                return None
            if type(container) is dict:
                names += len(container)
                strings.extend(container)
                values: Iterable[Any] = container.values()
            else:
                values = container
            for value in values:
                kind = type(value)
                if kind is str:
                    keep(value)
                elif kind is dict or kind is list:
                    below.append(value)
                elif kind is float and not -_LARGEST_INT_FLOAT < value < _LARGEST_INT_FLOAT:
                    return None
        level = below
    return names, strings


# Strict UTF-8 cannot carry a UTF-16 surrogate, so once the body has decoded, the only way a
# lone one gets into the parsed text is a \uD800-\uDFFF escape, which json.loads accepts. Such
# text cannot be encoded again (UTF-8 for routing, an engine's tokenizer), so it is refused
# here, naming the field. The byte pattern is only a fast path: it also matches valid pairs
# (an emoji written as two escapes) and escaped backslashes ("\\ud800" is not an escape), so a
# match means "walk the body", never "refuse".
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class DuplicateMember(Exception):
    """Raised by the parser's object hook; not a ValueError, so it is not read as bad JSON."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # An object whose name repeats is ambiguous: json.loads keeps the last, an engine's parser
    # may keep the first ("model":"a","model":"b" checked and routed as b, served as a).
    # Measured, the hook costs about 2 us on a 500-byte chat body and 0.5 us an object on a
    # large one (a 7.8 MB body of 200,000 objects: 167 ms to 260 ms); arrays of token ids hold
    # no objects and cost nothing more.
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise DuplicateMember(name)
            seen.add(name)
    return members


# One decoder for every body: json.loads builds a new one per call when given a hook.
DECODER = json.JSONDecoder(object_pairs_hook=unique_members)


def decoded(raw: bytes) -> str:
    try:
        # Strict UTF-8 (RFC 8259 for JSON on the wire): json.loads would decode bytes with
        # "surrogatepass" and let an encoded lone surrogate through. A BOM is tolerated.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise bad_request(
            "The request body must be JSON encoded as UTF-8.", code="invalid_json"
        ) from None


def _read_strictly(raw: bytes) -> dict[str, Any]:
    """json with the duplicate-name hook: every refusal of a body's JSON comes from here."""
    text = decoded(raw)
    try:
        body = DECODER.decode(text)
    except DuplicateMember as dup:
        shown = dup.name if len(dup.name) <= SHOWN_NAME else dup.name[:SHOWN_NAME] + "..."
        raise bad_request(
            f"The JSON body names '{shown}' twice in one object; each name may appear once.",
            param=shown,
            code="duplicate_key",
        ) from None
    except (ValueError, RecursionError):
        # RecursionError: deeply nested arrays exhaust the parser's stack, not ours.
        raise bad_request(
            "We could not parse the JSON body of your request.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    check_surrogates(raw, body)
    return body


def check_surrogates(raw: bytes, body: dict[str, Any]) -> None:
    """Refuse `body`, parsed from `raw`, if a string or a name in it holds a lone surrogate."""
    if len(raw) >= ASCII_WALK_BYTES and _all_ascii(body, len(raw) // ASCII_WALK_BYTES_PER_VALUE):
        return  # no surrogate: every string and name is ASCII
    if _SURROGATE_ESCAPE.search(raw):
        where = lone_surrogate_at(body)
        if where is not None:
            raise bad_request(
                f"'{where}' contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                "escape), which is not text.",
                param=where,
                code="invalid_encoding",
            )


# The byte pattern costs 0.3 to 0.6 ns a byte (one pass of the regex engine, slower where the
# text holds many escapes), a body's long strings included; a walk of the parsed body costs 0.1
# to 0.2 us a value (a message of a role and a string at the low end, text parts at the high),
# its strings' length aside (str.isascii reads a flag). So a large body of few values (an
# agent's context in one or a hundred messages) is walked first: where every string and name is
# ASCII, none holds a surrogate. The walk (the fast path's `_names_and_strings`) gives up past
# one value per ASCII_WALK_BYTES_PER_VALUE bytes or FAST_DEPTH levels, and where it gave up or a
# string is not ASCII the pattern runs as before: a walk within that budget costs at most about
# what the pattern would, and one given up adds about as much again. Measured on 200 to 240 KB
# chat bodies (shared 2-core VM, thread CPU time; the walk then stopped at the first string that
# was not ASCII, and measured the same since within the machine's noise): one message, 1.2 us
# where the pattern took 61; 20 messages, 8 us (135); 100 messages (bench/gateway/large.py's
# transcript), 36 us (61), and 37 (135) with text of many escapes, where a budget of one value
# per 2,048 bytes gave up and ran the pattern; given up, 200 messages 190 us (141), 25 messages
# of text parts 130 (74). Below ASCII_WALK_BYTES, the pattern only.
ASCII_WALK_BYTES = 16 * 1024
ASCII_WALK_BYTES_PER_VALUE = 512


def _all_ascii(body: dict[str, Any], budget: int) -> bool:
    """Whether every string and name in `body` is ASCII (then none holds a surrogate); False
    also when that is not found out within `budget` values (or FAST_DEPTH levels)."""
    shape = _names_and_strings(body, budget)
    return shape is not None and all(map(str.isascii, shape[1]))


# A step down the parsed body: (the path to the parent, a key or an index), None at the top. A
# linked path costs O(1) per value; the string is only built for the value at fault.
_Path = tuple["_Path", str | int] | None


def lone_surrogate_at(body: dict[str, Any]) -> str | None:
    """The path ('messages[0].content', 'user') of the first string or key in `body` holding a
    lone surrogate, or None. Iterative: json.loads nests as deep as the recursion limit, and a
    recursive walk started a few frames down would not."""
    stack: list[tuple[object, _Path]] = [(body, None)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
            return _render(path)
        elif isinstance(value, dict):
            for key in value:
                if not key.isascii() and _SURROGATE.search(key):
                    return _render(path) or "(a field name)"
            stack.extend(((v, (path, k)) for k, v in reversed(value.items())))
        elif isinstance(value, list):
            stack.extend((value[i], (path, i)) for i in range(len(value) - 1, -1, -1))
    return None


def _render(path: _Path) -> str:
    steps: list[str | int] = []
    while path is not None:
        path, step = path
        steps.append(step)
    text = ""
    for step in reversed(steps):
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text
