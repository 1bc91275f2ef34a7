"""Bodies built to hurt the gateway: text it cannot encode must not lock a key's budget, and a
large body must not stall every other request while it is parsed."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from typing import Any

import pytest

from gateway import proxy
from gateway.body_parse import BodyParser, prepare, upstream_payload
from gateway.errors import ApiError
from gateway.json_body import lone_surrogate_at, parse_json_object
from gateway.prompt_estimate import estimate_prompt_tokens
from gateway.request_body import EMBEDDINGS
from gateway.routing import RequestKey, prompt_bytes
from gateway.routing.affinity import owner
from store import KeyLimits, Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    assert_openai_error,
    recording_upstream,
    route,
    running_gateway,
)

MAX_TOKENS = 400


def good_body() -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me about otters"}],
        "max_tokens": MAX_TOKENS,
    }


async def budget_key(store: Store) -> tuple[int, dict[str, str]]:
    """A key whose budget is one good request's reservation: one more leaked reservation of
    any size and the good request is refused."""
    budget = estimate_prompt_tokens(good_body()) + MAX_TOKENS
    _, plaintext = await store.create_key(
        f"budget-{uuid.uuid4().hex[:6]}", limits=KeyLimits(token_budget=budget)
    )
    return budget, {"Authorization": f"Bearer {plaintext}", "Content-Type": "application/json"}


# A lone surrogate can only be written as a JSON escape: httpx would refuse to encode the str.
BAD_USER = (
    b'{"model":"smol","user":"\\ud800","max_tokens":400,'
    b'"messages":[{"role":"user","content":"tell me about otters"}]}'
)
BAD_CONTENT = (
    b'{"model":"smol","max_tokens":400,'
    b'"messages":[{"role":"user","content":"tell me about \\udfffotters"}]}'
)


async def test_a_lone_surrogate_is_a_400_naming_the_field_and_holds_no_budget(
    store: Store,
) -> None:
    _, headers = await budget_key(store)
    async with (
        recording_upstream() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        answers = []
        for _ in range(3):
            for raw in (BAD_USER, BAD_CONTENT):
                answers.append(
                    await gw.client.post("/v1/chat/completions", content=raw, headers=headers)
                )
        good = await gw.client.post("/v1/chat/completions", json=good_body(), headers=headers)
    for answer in answers:
        assert_openai_error(answer, 400, "invalid_encoding")
    assert [a.json()["error"]["param"] for a in answers[:2]] == ["user", "messages[0].content"]
    assert good.status_code == 200, good.text  # the whole budget is still there
    assert len(upstream.seen) == 1


async def test_an_exception_after_the_reservation_releases_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, headers = await budget_key(store)
    failures = [RuntimeError("routing broke")]

    def breaking_key(**fields: Any) -> Any:
        if failures:
            raise failures.pop()
        return proxy_request_key(**fields)

    proxy_request_key = RequestKey  # what the proxy builds its keys with
    monkeypatch.setattr(proxy, "RequestKey", breaking_key)
    async with (
        recording_upstream() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        broken = await gw.client.post("/v1/chat/completions", json=good_body(), headers=headers)
        good = await gw.client.post("/v1/chat/completions", json=good_body(), headers=headers)
    assert broken.status_code == 500
    assert good.status_code == 200, good.text
    assert len(upstream.seen) == 1


def test_the_surrogate_walk_names_the_field_and_ignores_what_only_looks_like_one() -> None:
    body = json.loads(b'{"a":[{"b":"ok"},{"c":["x","\\udc00"]}]}')
    assert lone_surrogate_at(body) == "a[1].c[1]"
    # An escaped backslash before "ud800", and a valid pair (an emoji), are text.
    fine = b'{"model":"m","x":"\\\\ud800","y":"\\ud83d\\ude00"}'
    assert parse_json_object(fine)["y"] == "\U0001f600"
    with pytest.raises(ApiError) as key:
        parse_json_object(b'{"model":"m","meta":{"\\ud800":1}}')
    assert key.value.param == "meta"
    # A surrogate encoded as UTF-8 bytes is not UTF-8: json.loads alone would accept it.
    with pytest.raises(ApiError) as raw:
        parse_json_object(b'{"model":"m","user":"\xed\xa0\x80"}')
    assert raw.value.code == "invalid_json"


# Text pieces a large body is made of: ASCII (words, and what only looks like a surrogate's
# escape), text that is not (Latin-1, CJK, an emoji json.dumps writes as an escaped pair), and
# lone surrogates.
ASCII_PIECES = ["word " * 40, "\\ud800"]
OTHER_PIECES = ["café ", "日本語 ", "\U0001f600"]
LONE_PIECES = ["\ud800", "\udfff"]


def text(rng: random.Random, pieces: list[str]) -> str:
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40)))


def large_body(rng: random.Random) -> bytes:
    """A chat body of 16 KB or more: a few long messages or many short ones, maybe a list of
    many numbers, all ASCII or not, now and then a lone surrogate in a text or a name."""
    pieces = ASCII_PIECES + (OTHER_PIECES if rng.random() < 0.5 else [])
    lone = rng.random() < 0.5
    turns = rng.choice((1, 3, 30, 300))
    messages = [{"role": "user", "content": text(rng, pieces)} for _ in range(turns)]
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if rng.random() < 0.3:
        body["logprobs_of"] = list(range(rng.choice((10, 5000))))
    if lone and rng.random() < 0.3:
        body["meta"] = {text(rng, pieces + LONE_PIECES)[:8]: 1}
    if lone and rng.random() < 0.7:
        rng.choice(messages)["content"] += rng.choice(LONE_PIECES)
    body["padding"] = "word " * 3300  # 16 KB at least
    raw = json.dumps(body, ensure_ascii=lone or rng.random() < 0.5).encode()
    # JSON's escapes may be written in upper case too.
    return raw.replace(b"\\ud", b"\\uD") if rng.random() < 0.5 else raw


def test_large_bodies_are_refused_for_a_lone_surrogate_as_the_escape_pattern_and_walk_say() -> None:
    # The plain check: where the byte pattern matches, walk the parsed body for the field.
    rng = random.Random(7)
    outcomes = set()
    for _ in range(300):
        raw = large_body(rng)
        body = json.loads(raw)
        expected = lone_surrogate_at(body) if re.search(rb"\\u[dD][89a-fA-F]", raw) else None
        if expected is None:
            assert parse_json_object(raw) == body
        else:
            with pytest.raises(ApiError) as caught:
                parse_json_object(raw)
            assert (caught.value.code, caught.value.param) == ("invalid_encoding", expected)
        outcomes.add(expected)
    # Bodies passed, and bodies refused naming several different fields.
    assert None in outcomes
    assert len(outcomes) > 2


def test_routing_never_raises_on_text() -> None:
    lone = "\ud800"
    assert owner(lone, ["r0", "r1"]) in (0, 1)
    assert prompt_bytes({"messages": [{"role": "user", "content": lone}]}).endswith(b"\xed\xa0\x80")


# --- large bodies ----------------------------------------------------------------------------

SIXTEEN_MB = 16 * 1024 * 1024


def many_small_values(size: int) -> bytes:
    """An embeddings body of `size` bytes that is nothing but one-token arrays: [[0],[0],...],
    the shape with the most JSON values, hence the slowest to parse, per byte."""
    head = b'{"model":"smol","input":['
    count = (size - len(head) - 2) // 4
    return head + b"[0]," * (count - 1) + b"[0]]}"


async def test_a_large_body_is_parsed_without_stalling_the_event_loop() -> None:
    raw = many_small_values(SIXTEEN_MB)
    started = time.perf_counter()
    parse_json_object(raw)  # what the event loop used to do: measured so the test means something
    inline_s = time.perf_counter() - started
    assert inline_s > 0.5

    parser = BodyParser(inline_bytes=64 * 1024, workers=1, wait_s=5)
    try:
        parsing = asyncio.create_task(parser.parse(EMBEDDINGS, raw))
        worst = 0.0
        while not parsing.done():
            tick = time.perf_counter()
            await asyncio.sleep(0.01)
            worst = max(worst, time.perf_counter() - tick)
        request = await parsing
    finally:
        parser.close()
    # Parsed inline, the loop would stall for the whole parse; a loaded machine delays every
    # wake-up a little, and the inline parse as much, so the bound grows with it.
    bound = max(0.5, inline_s / 2)
    assert worst < bound, f"the loop stalled {worst:.2f}s (inline parse: {inline_s:.2f}s)"
    assert request.prompt_estimate is not None
    assert request.prompt_estimate > 4_000_000
    assert request.body == {"model": "smol"}  # the tree stayed in the worker
    assert request.bulk is not None
    assert len(request.bulk) > SIXTEEN_MB - 100


async def test_large_bodies_beyond_the_workers_wait_then_get_503() -> None:
    parser = BodyParser(inline_bytes=1024, workers=1, wait_s=0.2)
    try:
        first = asyncio.create_task(parser.parse(EMBEDDINGS, many_small_values(4 * 1024 * 1024)))
        await asyncio.sleep(0.05)
        with pytest.raises(ApiError) as busy:
            await parser.parse(EMBEDDINGS, many_small_values(8 * 1024))
        await first
    finally:
        parser.close()
    assert busy.value.status == 503
    assert busy.value.headers["Retry-After"] == "1"


async def test_a_worker_keeps_the_order_of_refusals() -> None:
    """The key's allowlist answers before a bad field, as for a small body."""
    raw = b'{"model":"secret","n":0,"messages":[{"role":"user","content":"' + b"a" * 5000 + b'"}]}'

    def refuse_model(model: str, _adapter: str | None) -> None:
        raise ApiError(403, f"not {model}", code="model_not_allowed")

    parser = BodyParser(inline_bytes=0, workers=1, wait_s=5)  # every body to a worker
    try:
        with pytest.raises(ApiError) as refused:
            await parser.parse("/v1/chat/completions", raw, refuse_model)
        with pytest.raises(ApiError) as bad_field:
            await parser.parse("/v1/chat/completions", raw)
    finally:
        parser.close()
    assert refused.value.status == 403
    assert (bad_field.value.status, bad_field.value.param) == (400, "n")


def test_a_split_body_goes_upstream_with_the_gateways_changes_and_nothing_else_lost() -> None:
    body = {
        "model": "smol",
        "messages": [{"role": "user", "content": "x" * 2000}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "temperature": 0.5,
        "stream": True,
        "stream_options": {"include_usage": False},
    }
    raw = json.dumps(body).encode()
    prepared = prepare("/v1/chat/completions", raw, split=True)
    request = prepared.request
    assert request is not None
    assert request.bulk is not None
    assert "messages" not in request.body
    request.body["max_tokens"] = 7  # as _reserve clamps it
    request.body["stream_options"] = {"include_usage": True}
    sent = json.loads(upstream_payload(request, raw, changed=True))
    assert sent == {**body, "max_tokens": 7, "stream_options": {"include_usage": True}}


async def test_the_gateway_answers_others_while_it_parses_a_16_mb_body(store: Store) -> None:
    raw = many_small_values(SIXTEEN_MB)
    async with (
        recording_upstream() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        headers = {**gw.auth, "Content-Type": "application/json"}
        large = asyncio.create_task(
            gw.client.post("/v1/embeddings", content=raw, headers=headers, timeout=90)
        )
        worst, polls = 0.0, 0
        while not large.done():
            tick = time.perf_counter()
            assert (await gw.client.get("/healthz")).status_code == 200
            worst, polls = max(worst, time.perf_counter() - tick), polls + 1
            await asyncio.sleep(0.02)
        answer = await large
    # 4 million prompts: refused by the request limits, in the worker, after the parse.
    assert_openai_error(answer, 400, "max_prompts_per_request_exceeded")
    assert polls > 10, "the large request finished too fast to mean anything"
    assert worst < 0.5, f"/healthz took {worst:.2f}s while a 16 MB body was parsed"
    assert upstream.seen == []
