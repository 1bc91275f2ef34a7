"""KV routing on learned leading parts, through a running gateway: a chat whose system prompt
came back before is routed to the engine holding its blocks without asking any engine for
tokens, with the prediction its whole prompt would give; a template that puts the system prompt
into the last message is learned too; one that renders the last message first is not, and its
model is no longer learned."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gateway import prefix_tokens
from gateway.prefix_tokens import MISMATCHES_OFF
from kv.hashes import block_ids
from store import Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    fast_settings,
    running_gateway,
    serving_vllm,
)
from tests.unit.test_gateway_kv import kv_route
from tests.unit.test_gateway_proxy import metric
from tests.unit.test_kv_feeds import feed_server, opening
from workflows.engine_keys import engine_key_from_master, kv_feed_token, node_secret

NODE = "node-a"
ROLES = {"system": 1, "user": 2, "assistant": 3}
END, ASSISTANT_TURN = 4, 5
# 29 characters: with its role and end tokens and the user turn's opening, the learned part is
# exactly two blocks of 16.
SYSTEM = {"role": "system", "content": "You answer for otters; be kin"}
Template = Callable[[list[dict[str, str]]], list[int]]


def text(content: str) -> list[int]:
    return [100 + ord(c) % 900 for c in content]


def chatml(messages: list[dict[str, str]]) -> list[int]:
    """Each message in turn: rendered alike whatever follows it."""
    return [t for m in messages for t in [ROLES[m["role"]], *text(m["content"]), END]]


def system_last(messages: list[dict[str, str]]) -> list[int]:
    """Mistral's way: the system prompt goes into the last user message."""
    system = [m for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    if not rest:
        return chatml(system)
    *before, last = rest
    merged = {
        "role": last["role"],
        "content": "".join(m["content"] for m in system) + last["content"],
    }
    return chatml([*before, merged])


def last_first(messages: list[dict[str, str]]) -> list[int]:
    """The last message first: chats with the same leading messages share only its role."""
    return chatml([messages[-1], *messages[:-1]])


@dataclass
class Engine:
    template: Template
    key: str = ""
    url: str = ""
    tokenized: list[dict[str, Any]] = field(default_factory=list)


@asynccontextmanager
async def engine(replica_id: str, master: bytes, template: Template) -> AsyncIterator[Engine]:
    standin = Engine(template, engine_key_from_master(master, NODE, replica_id))

    async def tokenize(request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == f"Bearer {standin.key}"
        body = await request.json()
        standin.tokenized.append(body)
        tokens = standin.template(body["messages"])
        if body.get("add_generation_prompt", True):
            tokens.append(ASSISTANT_TURN)
        return web.json_response({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    async def chat(request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == f"Bearer {standin.key}"
        # The engine finds the system message's two blocks in its cache, as the feed says.
        usage = {
            "prompt_tokens": 40,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 32},
        }
        message = {"role": "assistant", "content": replica_id}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async with serving_vllm(tokenize, chat, metrics) as url:
        standin.url = url
        yield standin


def ask(question: str, system: dict[str, str] = SYSTEM) -> list[dict[str, str]]:
    return [system, {"role": "user", "content": question}]


@asynccontextmanager
async def kv_gateway(
    store: Store, template: Template, system: dict[str, str] = SYSTEM, held: bool = True
) -> AsyncIterator[tuple[Any, Engine, Engine]]:
    """A gateway before two engines; the second reports holding the system message's blocks,
    as another gateway's requests left them (unless not `held`: then neither holds any)."""
    master = await store.master_secret()
    token = kv_feed_token(node_secret(master, NODE))
    async with (
        feed_server(token) as feed,
        engine("r-a", master, template) as a,
        engine("r-b", master, template) as b,
    ):
        source = FakeRouteSource(kv_route("r-a", a.url, feed.url), kv_route("r-b", b.url, feed.url))
        async with running_gateway(store, source, fast_settings()) as gw:
            conn = await feed.accepted()
            # What every chat below begins with (ChatML): the system message, the user's turn.
            blocks = block_ids([*chatml([system]), ROLES["user"]], 16, "0") if held else []
            conn.send(*opening("e1", 2, {"r-a": [], "r-b": blocks}))

            deadline = time.monotonic() + 5
            while True:
                kv = (await gw.client.get("/admin/v1/kv")).json()
                if kv["replicas"].get("r-b") if held else kv["feeds"][0]["phase"] == "live":
                    break
                assert time.monotonic() < deadline, f"the feed's blocks never reached it: {kv}"
                await asyncio.sleep(0.01)
            yield gw, a, b


async def test_a_system_prompt_seen_twice_is_routed_without_asking_for_tokens(
    store: Store,
) -> None:
    async with kv_gateway(store, chatml) as (gw, a, b):
        questions = ["How many otters?", "What do they eat?", "Where?", "When do they sleep?"]
        for question in questions:
            answer = await gw.chat(messages=ask(question))
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == "r-b"
        asked = a.tokenized + b.tokenized
        # The first sight asks for the whole chat; the second also for the chat with its last
        # content empty, as history (no assistant turn); after that, nothing.
        assert len(asked) == 3
        (opened,) = [body for body in asked if body["messages"][-1]["content"] == ""]
        assert opened["messages"] == [SYSTEM, {"role": "user", "content": ""}]
        assert opened["add_generation_prompt"] is False
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="ok") == 2
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="learned") == 2
        assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 4
        # The learned part is exactly two blocks: the prompt goes on past them, so both can come
        # from the cache, as the whole prompt's ids said. Every prediction is the engine's 32.
        cached = "llmgw_kv_cached_tokens_total"
        assert await metric(gw, cached, model=MODEL, kind="predicted") == 4 * 32
        assert await metric(gw, cached, model=MODEL, kind="reported") == 4 * 32


LONG_SYSTEM = {"role": "system", "content": "You answer for otters; be kind. " * 20}


async def test_a_new_prefix_waits_for_no_tokens_and_is_learned_aside(store: Store) -> None:
    """A system prompt long enough to start a prefix, that no engine holds and this gateway
    never sent: its first chat is placed without asking an engine for tokens (they could not
    show it held anywhere), its leading part is learned meanwhile, and the chats after it are
    routed on that, to where the first went, asking no engine either."""
    async with kv_gateway(store, chatml, LONG_SYSTEM, held=False) as (gw, a, b):
        first = await gw.chat(messages=ask("How many otters?", LONG_SYSTEM))
        assert first.status_code == 200, first.text
        placed = first.json()["choices"][0]["message"]["content"]
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="new_prefix") == 1
        assert await metric(gw, "llmgw_routing_decisions_total", reason="new_prefix") == 1
        # Learned aside: the whole chat and the chat with its last content empty.
        deadline = time.monotonic() + 5
        while await metric(gw, "llmgw_kv_tokenize_total", outcome="ok") < 1:
            assert time.monotonic() < deadline, "the leading part was never learned"
            await asyncio.sleep(0.01)
        assert len(a.tokenized + b.tokenized) == 2
        for question in ("What do they eat?", "Where?"):
            answer = await gw.chat(messages=ask(question, LONG_SYSTEM))
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == placed
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="learned") == 2
        assert len(a.tokenized + b.tokenized) == 2


async def test_a_new_prefix_is_tokenized_where_an_engine_holds_what_another_sender_left(
    store: Store,
) -> None:
    """The same prompt where an engine holds blocks this gateway did not send it (another
    gateway's, or from before this one restarted): they might be the prefix, so the engine is
    asked, and the chat goes to the blocks."""
    async with kv_gateway(store, chatml, LONG_SYSTEM) as (gw, a, b):
        first = await gw.chat(messages=ask("How many otters?", LONG_SYSTEM))
        assert first.status_code == 200, first.text
        assert first.json()["choices"][0]["message"]["content"] == "r-b"
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="new_prefix") == 0
        assert len(a.tokenized + b.tokenized) == 1
        assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 1


async def test_a_system_prompt_in_the_last_message_is_learned_too(store: Store) -> None:
    async with kv_gateway(store, system_last) as (gw, a, b):
        for n in range(4):
            answer = await gw.chat(messages=ask(f"question {n}"))
            assert answer.status_code == 200, answer.text
        assert len(a.tokenized + b.tokenized) == 3
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="learned") == 2


async def test_a_template_rendering_the_last_message_first_is_not_learned(
    store: Store,
) -> None:
    async with kv_gateway(store, last_first) as (gw, a, b):
        for n in range(MISMATCHES_OFF + 3):
            answer = await gw.chat(messages=ask(f"question {n}"))
            assert answer.status_code == 200, answer.text
        asked = a.tokenized + b.tokenized
        opened = [body for body in asked if body["messages"][-1]["content"] == ""]
        # Every chat asked for its whole prompt; the opened turn was asked for from the second
        # sight until learning stopped.
        assert len(asked) - len(opened) == MISMATCHES_OFF + 3
        assert len(opened) == MISMATCHES_OFF
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="learned") == 0


async def test_a_learned_part_a_chat_does_not_begin_with_is_dropped(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question that begins like the empty content's rendering teaches too much; the spot
    check of a later chat, asked aside, finds it."""
    monkeypatch.setattr(prefix_tokens, "SPOT_CHECK_EVERY", 2)

    def empty_says_none(messages: list[dict[str, str]]) -> list[int]:
        last = messages[-1]
        shown = {**last, "content": last["content"] or "none"}
        return chatml([*messages[:-1], shown])

    async with kv_gateway(store, empty_says_none) as (gw, a, b):
        questions = ["nonetheless?", "nonetheless!", "Why?", "Why not?", "How?", "When?"]
        # 1: seen; 2: learned, "none" included; 3: answered from it; 4: answered from it too,
        # and spot-checked aside: dropped; 5: learned again, from "How?"; 6: answered from that.
        asked_by_then = [1, 3, 3, 4, 6, 6]
        for question, expected in zip(questions, asked_by_then, strict=True):
            answer = await gw.chat(messages=ask(question))
            assert answer.status_code == 200, answer.text
            deadline = time.monotonic() + 5
            while len(a.tokenized + b.tokenized) < expected:  # the spot check comes aside
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert len(a.tokenized + b.tokenized) == expected
        assert await metric(gw, "llmgw_kv_tokenize_total", outcome="learned") == 3
