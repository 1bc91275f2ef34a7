"""A body's JSON read by orjson only where json would have read it the same: on random and
hostile bodies, parse_json_object answers exactly as json with the duplicate-name hook does
(the same tree, number types included, or the same refusal), and ordinary bodies take the fast
path."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from gateway import json_body
from gateway.errors import ApiError
from gateway.json_body import FAST_DEPTH, parse_json_object, read_json_object


class Pairs(list[tuple[str, Any]]):
    """An object as written, names possibly repeated."""


def outcome(read: Any, raw: bytes) -> tuple[Any, ...]:
    try:
        body = read(raw)
    except ApiError as err:
        return ("refused", err.status, err.message, err.param, err.code)
    # json.dumps tells 1 from 1.0 and -0.0 from 0.0, and keeps the order of names.
    return ("read", json.dumps(body))


def strictly(raw: bytes) -> dict[str, Any]:
    return json_body._read_strictly(raw)


def assert_as_json_reads(raw: bytes) -> None:
    assert outcome(parse_json_object, raw) == outcome(strictly, raw), raw[:200]


EDGES = [
    b' { "model" : "m" , "b" : [1, 2, {"c": null}] } \r\n',
    b"{}",
    b"[]",
    b'"x"',
    b"",
    b" ",
    b'{"a":1,}',
    b'{"a":1}x',
    b'{"a":1,"a":2}',
    b'{"a":{"x":1,"x":2},"b":3}',
    b'{"a":[{"x":1},{"y":2,"y":3}]}',
    b'\xef\xbb\xbf{"a":"\xc3\xa9"}',
    b'\xef\xbb\xbf{"a":"\xc3\xa9","b":"\\ud800"}',
    b'{"a":"\\ud83d\\ude00","\xc3\xa9":[1]}',
    b'{"a":"\\ud800x"}',
    b'{"a":"\\udc00\\ud800"}',
    b'{"a":NaN,"b":-Infinity}',
    b'{"a":1e400}',
    b'{"a":"\x01"}',
    b'{"a":"\x7f"}',
    b'{"a":"\xed\xa0\x80"}',
    b'\xff{"a":1}',
    b'{"a":18446744073709551615,"b":18446744073709551616,"c":-9223372036854775809}',
    b'{"a":-9223372036854775808,"b":9.3e18,"c":-0,"d":-0.0,"e":1e-400,"f":1E2}',
    b'{"":1,"x\\"y":"z"}',
    # Colons: in names, in text, escaped, and repeated names beside them.
    b'{"a:b":"c:d","e":"f"}',
    b'{"a":"x:y","a":"z"}',
    b'{"a":"\\u003a","a":1}',
    b'{"a":"\\u003a"}',
    b'{"a\\u003Ab":1,"a:b":2}',
    b'{"a":"\\\\u003a:","b":1}',
    b'{"a" :1, "a" : 2}',
    b'{"t":"https://x/y","u":"https://x/y","t":"z"}',
    # A repeated name whose dropped colon an escaped one makes up for, in the counts of colons
    # and of backslashes both (a backslash written as \u005c takes one fewer).
    b'{"a":"\\u003a","a":"\\u003a"}',
    b'{"a":"x","a":"\\u003a\\u005c"}',
    b'{"a":"x","a":"\\u003A\\\\"}',
    b'{"a":"\\u003a\\n","b":"\\"","a":"\\u003a\\n"}',
    # Nesting around the fast path's limit and json's.
    b'{"a":' + b"[" * (FAST_DEPTH - 1) + b"]" * (FAST_DEPTH - 1) + b"}",
    b'{"a":' + b"[" * FAST_DEPTH + b"]" * FAST_DEPTH + b"}",
    b'{"a":' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}",
]


@pytest.mark.parametrize("raw", EDGES)
def test_edge_bodies_read_or_are_refused_as_json_reads_them(raw: bytes) -> None:
    assert_as_json_reads(raw)


def _string(rng: random.Random) -> str:
    alphabet = 'ab :"\\/\n\t\x01é€😀\u2028'
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 3, 12])))


def _value(rng: random.Random, depth: int) -> Any:
    draw = rng.random()
    if depth < 4 and draw < 0.25:
        names = [rng.choice(["a", "b", "a:b", ":", "é", _string(rng)]) for _ in range(3)]
        return Pairs((name, _value(rng, depth + 1)) for name in names[: rng.randint(0, 3)])
    if depth < 4 and draw < 0.4:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if draw < 0.7:
        return _string(rng)
    return rng.choice(
        [
            0,
            -1,
            2**63 - 1,
            2**64 - 1,
            2**64,
            -(2**63) - 1,
            10**30,
            0.5,
            -0.0,
            1e300,
            9.3e18,
            2.0**63,
            True,
            None,
            "1e400",
            "-0",
            "1E-400",
            "NaN",
        ]
    )


def _write_string(text: str, rng: random.Random) -> str:
    out = ['"']
    for char in text:
        if rng.random() < 0.15 or char in '"\\' or char < " ":
            if ord(char) > 0xFFFF:
                code = ord(char) - 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}")
            else:
                out.append(f"\\u{ord(char):04{rng.choice('xX')}}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _write(value: Any, rng: random.Random) -> str:
    space = rng.choice(["", "", " ", "\n\t"])
    if isinstance(value, Pairs):
        members = [
            f"{space}{_write_string(name, rng)}{space}:{space}{_write(v, rng)}" for name, v in value
        ]
        return "{" + ",".join(members) + space + "}"
    if isinstance(value, list):
        return "[" + ",".join(_write(v, rng) for v in value) + space + "]"
    if isinstance(value, str) and value in ("1e400", "-0", "1E-400", "NaN"):
        return value  # a number as written
    if isinstance(value, str):
        return _write_string(value, rng)
    return json.dumps(value)


@pytest.mark.parametrize("seed", range(20))
def test_random_bodies_read_or_are_refused_as_json_reads_them(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        top = _value(rng, 0)
        if not isinstance(top, Pairs):
            top = Pairs([("model", top)])
        raw = _write(top, rng).encode()
        if rng.random() < 0.1:
            raw = b"\xef\xbb\xbf" + raw
        if rng.random() < 0.05 and raw:
            at = rng.randrange(len(raw))
            raw = raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1 :]
        assert_as_json_reads(raw)


def test_ordinary_bodies_take_the_fast_path() -> None:
    """What clients send (colons and URLs in text, non-ASCII, a BOM, tools' schemas) is read by
    orjson, so the speed is there where it counts."""
    bodies = [
        {"model": "m", "messages": [{"role": "user", "content": "Note: see https://a/b"}]},
        {"model": "m", "messages": [{"role": "user", "content": 'a: "b"\n\t' * 5000}]},
        {"model": "m", "messages": [{"role": "user", "content": "中文 😀" * 1000}]},
        {
            "model": "m",
            "prompt": "a" * 200_000,
            "max_tokens": 16,
            "tools": [{"type": "function", "function": {"parameters": {"a:b": {"x": [1.5]}}}}],
        },
    ]
    for body in bodies:
        for raw in (
            json.dumps(body).encode(),
            # As httpx (so the OpenAI SDK for Python) writes a body.
            json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
        ):
            for sent in (raw, b"\xef\xbb\xbf" + raw):
                read, by_orjson = read_json_object(sent)
                assert by_orjson
                assert read == body


def test_orjson_writes_each_character_with_the_fewest_backslashes() -> None:
    """What the backslash count in json_body._same_names rests on: orjson escapes a quote and
    each control character with one backslash, a backslash with two, and nothing else. Checked
    over every code point, so an orjson that began escaping more would fail here first."""
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # not text: the fast path never holds one
        char = chr(code)
        expected = 2 if char == "\\" else 1 if char == '"' or code < 0x20 else 0
        assert orjson.dumps(char).count(b"\\") == expected, hex(code)
