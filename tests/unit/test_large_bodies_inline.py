"""Large prompts on the event loop: a 200 KB body of a few long strings is parsed inline, goes
upstream as the client's own bytes, or as the changed body written again, and is refused for
exactly what any other body is refused for."""

from __future__ import annotations

import json
import random
from dataclasses import FrozenInstanceError, replace
from typing import Any

import pytest

from gateway.body_parse import (
    READ_FIRST_FACTOR,
    BodyParser,
    few_values,
    prepare,
    read_first,
    upstream_payload,
)
from gateway.errors import ApiError
from gateway.json_body import parse_json_object
from gateway.prompt_estimate import estimate_prompt_tokens
from gateway.request_body import CHAT, COMPLETIONS, parse_proxied_request
from gateway.routing import prompt_bytes

INLINE = 64 * 1024
WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "with,", "be", "not."]


def text(size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    out = " ".join(rng.choice(WORDS) for _ in range(size // 3))
    return out[:size]


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def many_small_values(size: int) -> bytes:
    head = b'{"model":"smol","input":['
    count = (size - len(head) - 2) // 4
    return head + b"[0]," * (count - 1) + b"[0]]}"


async def test_a_200_kb_prompt_is_parsed_inline_and_sent_as_the_client_sent_it() -> None:
    raw = compact(chat(text(200 * 1024), max_tokens=16))
    assert len(raw) > INLINE
    assert few_values(raw, INLINE)
    parser = BodyParser(INLINE, workers=1, wait_s=5)
    try:
        request = await parser.parse(CHAT, raw)
        assert parser._pool is None  # no worker was started
    finally:
        parser.close()
    assert request.bulk is None
    assert upstream_payload(request, raw, changed=False) is raw
    # What the worker's path makes of it reads the same.
    split = prepare(CHAT, raw, split=True).request
    assert split is not None
    assert json.loads(upstream_payload(split, raw, changed=False)) == json.loads(raw)
    assert request.prompt_estimate == split.prompt_estimate
    assert request.routing_prompt == split.routing_prompt


@pytest.mark.parametrize(
    "body",
    [
        chat(text(200 * 1024), max_tokens=16, stream=True, stream_options={"x": 1}),
        {
            "model": "m",
            "messages": [
                {"role": "user" if i % 2 else "assistant", "content": text(2000, i)}
                for i in range(100)
            ],
            "priority": 3,
        },
        chat("\u4e2d\u6587 " * 40_000 + "\U0001f600", temperature=0.5),
    ],
)
def test_a_changed_large_body_goes_upstream_as_a_whole_serialisation_would(
    body: dict[str, Any],
) -> None:
    """Model renamed, stream_options rewritten, priority taken out, max_tokens clamped: what
    goes upstream is the changed body, by either path."""
    raw = compact(body)
    paths = {}
    for split in (False, True):
        request = prepare(CHAT, raw, split=split).request
        assert request is not None
        assert request.by_orjson
        sent = request.body
        sent["model"] = "upstream-name"
        sent["max_tokens"] = 7
        if "stream" in body:
            sent["stream_options"] = {**sent["stream_options"], "include_usage": True}
        sent.pop("priority", None)
        paths[split] = upstream_payload(request, raw, changed=True)
    expected = dict(body, model="upstream-name", max_tokens=7)
    expected.pop("priority", None)
    if "stream" in body:
        expected["stream_options"] = {"x": 1, "include_usage": True}
    for sent_bytes in paths.values():
        assert json.loads(sent_bytes) == expected
    # Inline, in the body's own order (a split body sends its bulk first).
    assert list(json.loads(paths[False])) == list(expected)


def test_bodies_of_many_small_values_still_go_to_a_worker() -> None:
    assert not few_values(many_small_values(200 * 1024), INLINE)
    assert not few_values(many_small_values(INLINE + 100), INLINE)
    # Few values, but too long to parse on the event loop.
    assert not few_values(compact(chat(text(2 * 1024 * 1024))), INLINE)
    # A threshold of 0 sends every body to a worker, as before.
    assert not few_values(compact(chat("hi")), 0)


def transcript(turns: int, turn_bytes: int) -> dict[str, Any]:
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": text(turn_bytes, i)} for i in range(turns)]
    return {"model": "m", "messages": messages, "max_tokens": 16}


@pytest.mark.parametrize("shape", ["one string", "transcript"])
async def test_an_agents_context_is_read_once_by_orjson_and_prepared_as_before(shape: str) -> None:
    body = chat(text(200 * 1024)) if shape == "one string" else transcript(100, 2048)
    raw = compact(body)
    assert INLINE < len(raw) <= READ_FIRST_FACTOR * INLINE
    read = read_first(raw, INLINE)
    assert read == json.loads(raw)
    parser = BodyParser(INLINE, workers=1, wait_s=5)
    try:
        request = await parser.parse(CHAT, raw)
        assert parser._pool is None
    finally:
        parser.close()
    assert request == prepare(CHAT, raw).request
    assert request.by_orjson


def many_scalars(size: int) -> bytes:
    head = b'{"model":"smol","prompt":"x","logit_bias":{"1":0},"stop":['
    count = (size - len(head) - 2) // 4
    return head + b'"a",' * (count - 1) + b'"a"]}'


@pytest.mark.parametrize(
    "raw",
    [
        many_small_values(200 * 1024),  # more `[` than the bound: not even read
        many_scalars(200 * 1024),  # few containers, too many values: read, then left
        compact(chat(text(READ_FIRST_FACTOR * INLINE + 1))),  # too long to read first
    ],
)
def test_bodies_read_first_only_within_the_inline_bounds(raw: bytes) -> None:
    assert read_first(raw, INLINE) is None


async def test_a_body_of_few_containers_but_many_values_goes_to_a_worker() -> None:
    raw = many_scalars(200 * 1024)
    parser = BodyParser(INLINE, workers=1, wait_s=30)
    try:
        request = await parser.parse(COMPLETIONS, raw)
        assert parser._pool is not None
    finally:
        parser.close()
    assert request.bulk is not None  # a worker's split body: its bulk serialised there
    assert json.loads(upstream_payload(request, raw, changed=False)) == json.loads(raw)


@pytest.mark.parametrize(
    ("raw", "param", "code"),
    [
        (
            b'{"model":"m","messages":[{"role":"user","content":"\\udc00'
            + b"a" * 100_000
            + b'"}]}',
            "messages[0].content",
            "invalid_encoding",
        ),
        (
            b'{"model":"m","messages":[{"role":"user","content":"'
            + b"a" * 100_000
            + b'"}],"model":"n"}',
            "model",
            "duplicate_key",
        ),
        (
            b'{"model":"m","messages":[{"role":"user","role":"x","content":"'
            + b"a" * 100_000
            + b'"}]}',
            "role",
            "duplicate_key",
        ),
        (
            b'{"model":"m","messages":[{"role":"user","content":"\xff' + b"a" * 100_000 + b'"}]}',
            None,
            "invalid_json",
        ),
    ],
)
async def test_a_large_body_parsed_inline_is_refused_as_before(
    raw: bytes, param: str | None, code: str
) -> None:
    parser = BodyParser(INLINE, workers=1, wait_s=5)
    try:
        with pytest.raises(ApiError) as inline:
            await parser.parse(CHAT, raw)
        assert parser._pool is None
    finally:
        parser.close()
    assert (inline.value.status, inline.value.param, inline.value.code) == (400, param, code)
    worker = prepare(CHAT, raw, split=True)
    assert worker.refusal is not None
    assert (worker.refusal.param, worker.refusal.code) == (param, code)


@pytest.mark.parametrize("size", [10, 200_000])
def test_a_prepared_request_holds_every_field_it_was_parsed_with_and_stays_frozen(
    size: int,
) -> None:
    body = chat(
        text(size),
        stream=True,
        stream_options={"include_usage": True},
        user="u1",
        max_tokens=16,
    )
    body["messages"].append(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://a/b"}}]}
    )
    raw = compact(body)
    request = prepare(CHAT, raw).request
    assert request is not None
    parsed = parse_proxied_request(CHAT, parse_json_object(raw))
    assert request == replace(
        parsed,
        prompt_estimate=estimate_prompt_tokens(body),
        routing_prompt=prompt_bytes(body),
        by_orjson=True,
    )
    assert (request.stream, request.wants_usage, request.user) == (True, True, "u1")
    assert request.media_urls == (("messages[1].content[0].image_url", "https://a/b"),)
    with pytest.raises(FrozenInstanceError):
        request.model = "other"  # type: ignore[misc]
