"""Asking an engine's /tokenize for a prompt's token ids (KV-aware routing): what is sent for
chat and completion bodies, what is not asked at all, and every failure ending in None."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from gateway.body_parse import prepare, upstream_payload
from gateway.request_body import CHAT
from gateway.tokenize import engine_token_ids, tokenize_body
from tests.gateway_kit import serving
from workflows.contracts import KvSource, ReplicaState, Route

KEY = "llmgw-engine-test"
TOKENS = [1, 15, 300, 7, 7, 2]


@dataclass
class Tokenizer:
    """A vLLM /tokenize stand-in that records what it was sent."""

    url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    answer: Any = None
    delay_s: float = 0.0


@asynccontextmanager
async def tokenizer() -> AsyncIterator[Tokenizer]:
    standin = Tokenizer()

    async def tokenize(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": "key"}, status=401)
        standin.seen.append(await request.json())
        await asyncio.sleep(standin.delay_s)
        answer = standin.answer
        if answer is None:
            answer = {"count": len(TOKENS), "max_model_len": 4096, "tokens": TOKENS}
        return web.json_response(answer, status=standin.status)

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    async with serving(app) as url:
        standin.url = url
        yield standin


def route(url: str) -> Route:
    return Route(
        replica_id="r1",
        model="m",
        node="node-a",
        endpoint=url + "/v1",  # as the ledger may give it
        engine="vllm",
        state=ReplicaState.READY,
        kv=KvSource(feed="http://node-a:9400", block_size=16),
    )


CHAT_BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "chat_template_kwargs": {"enable_thinking": False},
    "temperature": 0.3,
    "max_tokens": 9,
    "stream": True,
    "stream_options": {"include_usage": True},
    "cache_salt": "tenant",
}


async def test_a_chat_body_is_tokenized_with_its_template_inputs_only() -> None:
    async with tokenizer() as standin, aiohttp.ClientSession() as session:
        ids = await engine_token_ids(session, route(standin.url), CHAT_BODY, KEY, 2.0)
    assert ids == tuple(TOKENS)
    assert standin.seen == [
        {
            "model": "m",
            "messages": CHAT_BODY["messages"],
            "tools": CHAT_BODY["tools"],
            "chat_template_kwargs": {"enable_thinking": False},
            "add_generation_prompt": True,
        }
    ]


async def test_a_completion_body_sends_its_one_prompt() -> None:
    async with tokenizer() as standin, aiohttp.ClientSession() as session:
        plain = {"model": "m", "prompt": "Once upon", "max_tokens": 3, "echo": False}
        listed = {"model": "m", "prompt": ["Once upon"], "add_special_tokens": False}
        got = [
            await engine_token_ids(session, route(standin.url), body, KEY, 2.0)
            for body in (plain, listed)
        ]
    assert got == [tuple(TOKENS), tuple(TOKENS)]
    assert standin.seen == [
        {"model": "m", "prompt": "Once upon"},
        {"model": "m", "prompt": "Once upon", "add_special_tokens": False},
    ]


async def test_what_is_not_worth_asking_is_not_asked() -> None:
    async with tokenizer() as standin, aiohttp.ClientSession() as session:
        ask = engine_token_ids
        where = route(standin.url)
        # Token ids given by the client are the token ids: no round trip.
        assert await ask(session, where, {"model": "m", "prompt": [5, 6, 7]}, KEY, 2.0) == (5, 6, 7)
        assert await ask(session, where, {"model": "m", "prompt": [[5, 6]]}, KEY, 2.0) == (5, 6)
        # Several prompts, or media parts: None, and the engine is not bothered.
        several = {"model": "m", "prompt": ["a", "b"]}
        assert await ask(session, where, several, KEY, 2.0) is None
        assert await ask(session, where, {"model": "m", "prompt": [[1], [2]]}, KEY, 2.0) is None
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
        media = {"model": "m", "messages": [{"role": "user", "content": [image]}]}
        assert await ask(session, where, media, KEY, 2.0) is None
    assert standin.seen == []


async def test_a_slow_engine_times_out_to_none() -> None:
    async with tokenizer() as standin, aiohttp.ClientSession() as session:
        standin.delay_s = 1.0
        started = time.monotonic()
        ids = await engine_token_ids(session, route(standin.url), CHAT_BODY, KEY, 0.2)
        took = time.monotonic() - started
    assert ids is None
    assert took < 0.9


async def test_every_failure_is_none() -> None:
    async with tokenizer() as standin, aiohttp.ClientSession() as session:
        where = route(standin.url)
        assert await engine_token_ids(session, where, CHAT_BODY, "wrong-key", 2.0) is None
        for status, answer in [
            (500, {"error": "boom"}),
            (200, {"tokens": [1, "two"]}),
            (200, {"tokens": [1, -2]}),
            (200, {"tokens": [True]}),
            (200, ["not", "an", "object"]),
            (200, {"count": 3}),
        ]:
            standin.status, standin.answer = status, answer
            assert await engine_token_ids(session, where, CHAT_BODY, KEY, 2.0) is None, answer
    async with aiohttp.ClientSession() as session:
        gone = route("http://127.0.0.1:1")
        assert await engine_token_ids(session, gone, CHAT_BODY, KEY, 2.0) is None


def test_a_split_large_body_sends_only_its_prompt_fields() -> None:
    """A large body is split in a worker (gateway/body_parse.py): its prompt fields lead the
    bulk, so /tokenize gets them as a slice, without the body's other bulky fields."""
    body = {
        **CHAT_BODY,
        "messages": [{"role": "user", "content": "x" * 70_000}],
        "stop": ["END", "STOP"],
        "response_format": {"type": "json_object"},
    }
    raw = json.dumps(body).encode()
    request = prepare(CHAT, raw, split=True).request
    assert request is not None
    assert request.bulk is not None
    assert "messages" not in request.body
    made = tokenize_body(True, request.body, request.bulk[: request.bulk_prompt_bytes])
    assert isinstance(made, bytes)
    assert json.loads(made) == {
        "model": "m",
        "messages": body["messages"],
        "tools": body["tools"],
        "chat_template_kwargs": body["chat_template_kwargs"],
        "add_generation_prompt": True,
    }
    # What goes upstream is still the whole body.
    assert json.loads(upstream_payload(request, raw, changed=False)) == body
