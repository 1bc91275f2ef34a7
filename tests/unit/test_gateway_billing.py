"""Billing every choice and every prompt, and dropping streaming clients that stop reading.

The engine here stands in for llama.cpp where it under-reports: its server runs each choice as
a task of its own and, merging a whole response, keeps the first task's usage only
(tools/server/server-context.cpp, handle_completions_impl); streamed, each task ends with a
usage chunk of its own.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gateway.billing import (
    choices_requested,
    completion_length,
    stream_counts,
    whole_response_counts,
)
from gateway.quota import QuotaBook, Reservation
from gateway.request_body import CHAT, COMPLETIONS
from gateway.sse import StreamFilter, data_event
from store import KeyLimits, Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    fast_settings,
    http_request,
    route,
    running_gateway,
    serving,
    sse_events,
)

WORDS = ["one", "two", "three"]  # each choice's reply: three tokens
PROMPT_TOKENS = 5


@dataclass(frozen=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    token_budget: int | None = None
    budget_period: str = "day"


# --- pure: what a request generates, what is reserved, what is billed --------------------


def test_choices_count_n_best_of_and_every_prompt() -> None:
    assert choices_requested(CHAT, {"messages": []}) == (1, 1)
    assert choices_requested(CHAT, {"n": 2}) == (2, 1)
    assert choices_requested(CHAT, {"n": 2, "best_of": 5}) == (5, 1)
    # llama.cpp's own name for n, which it reads first.
    assert choices_requested(CHAT, {"n_cmpl": 4}) == (4, 1)
    assert choices_requested(COMPLETIONS, {"prompt": ["a", "b", "c"], "n": 2}) == (6, 3)
    assert choices_requested(COMPLETIONS, {"prompt": [[1, 2], [3]]}) == (2, 2)
    assert choices_requested(COMPLETIONS, {"prompt": [1, 2, 3]}) == (1, 1)  # one prompt of ids


def test_llamas_n_predict_bounds_a_completion_too() -> None:
    # llama.cpp reads n_predict before max_tokens: both are clamped, the longer one counts.
    assert completion_length({"max_tokens": 10, "n_predict": 900}) == (
        ["max_tokens", "n_predict"],
        900,
    )
    # -1 is llama.cpp's "no limit": reserved as unbounded, and clamped when a budget applies.
    assert completion_length({"max_tokens": 10, "n_predict": -1}) == (
        ["max_tokens", "n_predict"],
        None,
    )
    assert completion_length({}) == (["max_tokens"], None)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"max_tokens": None}, (["max_tokens"], None)),
        ({"max_tokens": None, "n_predict": 5}, (["max_tokens", "n_predict"], 5)),
        (
            {"n_predict": 7, "max_completion_tokens": 30},
            (["max_completion_tokens", "n_predict"], 30),
        ),
        # Anything but a positive count (0, a boolean, a float) asks for no limit: the fields
        # that hold a value are clamped.
        ({"max_completion_tokens": 0}, (["max_completion_tokens"], None)),
        (
            {"max_tokens": True, "max_completion_tokens": 7, "n_predict": None},
            (["max_tokens", "max_completion_tokens"], None),
        ),
        ({"max_tokens": 1.5, "n_predict": None}, (["max_tokens"], None)),
    ],
)
def test_every_length_field_present_is_clamped_and_the_longest_counts(
    body: dict[str, Any], expected: tuple[list[str], int | None]
) -> None:
    assert completion_length(body) == expected


def test_a_reservation_holds_max_tokens_for_every_choice_and_clamps_per_choice() -> None:
    book = QuotaBook()
    reservation = book.reserve_completion(
        "k", Limits(token_budget=10_000), 100, 500, 0.0, choices=3
    )
    assert isinstance(reservation, Reservation)
    assert reservation.tokens == 100 + 3 * 500
    # The engine applies max_tokens to each choice: it stays what the client asked.
    assert reservation.max_tokens == 500
    # A budget too small for three full choices shares what is left among them.
    tight = book.reserve_completion("t", Limits(token_budget=1_000), 100, 500, 0.0, choices=3)
    assert isinstance(tight, Reservation)
    assert tight.max_tokens == 300
    assert tight.tokens <= 1_000


def reserved(choices: int, per_choice: int, prompts: int = 1) -> Reservation:
    reservation = Reservation("k", 0)
    reservation.choices, reservation.per_choice_tokens, reservation.prompts = (
        choices,
        per_choice,
        prompts,
    )
    return reservation


def whole(choices: int, completion: int, prompt: int = PROMPT_TOKENS) -> bytes:
    listed = [{"index": i, "message": {"content": "one two three"}} for i in range(choices)]
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return json.dumps({"choices": listed, "usage": usage}).encode()


def test_a_whole_answer_bills_the_unreported_choices_at_their_max_tokens() -> None:
    # llama.cpp: two choices, the usage of the first only. The second could have been up to
    # max_tokens long, and nothing in the answer says how long it was.
    raw = whole(2, 3)
    assert whole_response_counts(raw, "llamacpp", reserved(2, 20), 50) == (PROMPT_TOKENS, 3 + 20)
    # vLLM and SGLang count every choice in their usage: believed as they report it.
    assert whole_response_counts(whole(2, 6), "vllm", reserved(2, 20), 50) == (PROMPT_TOKENS, 6)
    # One choice: the engine's usage, untouched.
    assert whole_response_counts(whole(1, 3), "llamacpp", reserved(1, 20), 50) == (5, 3)
    # Several prompts: llama.cpp counts the first; the gateway's upper bound covers them all.
    assert whole_response_counts(whole(3, 3), "llamacpp", reserved(3, 20, 3), 50) == (50, 43)
    # An older llama.cpp answered an array of prompts with an array of whole responses.
    older = json.dumps([json.loads(whole(1, 3)), json.loads(whole(1, 4, 7))]).encode()
    assert whole_response_counts(older, "llamacpp", reserved(2, 20, 2), 50) == (12, 7)


def two_choice_stream(usage_chunks: list[dict[str, int]], tokens: int = 3) -> list[bytes]:
    events = []
    for t in range(tokens):
        for i in (0, 1):
            delta = {"content": f" w{t}"} if t else {"role": "assistant", "content": "w0"}
            events.append(data_event({"choices": [{"index": i, "delta": delta}]}))
    for i in (0, 1):
        events.append(data_event({"choices": [{"index": i, "delta": {}, "finish_reason": "stop"}]}))
    events += [data_event({"choices": [], "usage": usage}) for usage in usage_chunks]
    return [*events, data_event(b"[DONE]")]


def relayed(events: list[bytes], choices: int, prompts: int = 1) -> tuple[int, int] | None:
    stream_filter = StreamFilter(client_wants_usage=False)
    stream_filter.usage_filter.count_choices = choices > 1
    for event in events:
        stream_filter.feed(event)
    return stream_counts(stream_filter.usage_filter, reserved(choices, 20, prompts))


def test_a_stream_bills_every_choice_it_carried() -> None:
    one = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 3}
    # An engine that reports one choice of two: the gateway saw six tokens go by.
    assert relayed(two_choice_stream([one]), 2) == (PROMPT_TOKENS, 6)
    # llama.cpp: one usage chunk per choice, each with the (shared) prompt: added up, the
    # prompt counted once.
    assert relayed(two_choice_stream([one, one]), 2) == (PROMPT_TOKENS, 6)
    # Two prompts of one choice each: their prompts add up.
    assert relayed(two_choice_stream([one, one]), 2, prompts=2) == (2 * PROMPT_TOKENS, 6)
    # A single choice keeps the engine's own figures (role and finish chunks are no tokens).
    assert relayed(two_choice_stream([one]), 1) == (PROMPT_TOKENS, 3)


# --- over HTTP: an engine that under-reports like llama.cpp --------------------------------


@dataclass
class Engine:
    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    streamed: int = 0  # chunks written by the slow stream
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # it saw its client leave


def choices_of(body: dict[str, Any]) -> int:
    return int(body.get("n_cmpl") or body.get("n") or 1)


@asynccontextmanager
async def llama_like() -> AsyncIterator[Engine]:
    engine = Engine()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        engine.bodies.append(body)
        n = choices_of(body)
        if body.get("stream"):
            return await stream(request, n)
        listed = [
            {"index": i, "message": {"role": "assistant", "content": " ".join(WORDS)}}
            for i in range(n)
        ]
        # llama.cpp merges its tasks' choices into the first task's response, usage included.
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(WORDS)}
        return web.json_response({"object": "chat.completion", "choices": listed, "usage": usage})

    async def stream(request: web.Request, n: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in WORDS:
            for i in range(n):
                delta = {"index": i, "delta": {"content": word}, "finish_reason": None}
                await response.write(data_event({"choices": [delta]}))
        for i in range(n):
            end = {"index": i, "delta": {}, "finish_reason": "stop"}
            await response.write(data_event({"choices": [end]}))
        # An engine that reports one choice's tokens for the whole stream.
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(WORDS)}
        await response.write(data_event({"choices": [], "usage": usage}))
        await response.write(data_event(b"[DONE]"))
        return response

    async def endless(request: web.Request) -> web.StreamResponse:
        """Generates as fast as its client takes it, up to far more than any buffer holds."""
        engine.bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        piece = {"choices": [{"index": 0, "delta": {"content": "x" * 200}}]}
        try:
            for _ in range(200_000):
                await response.write(data_event(piece))
                engine.streamed += 1
        except (ConnectionError, RuntimeError):
            engine.gone.set()  # the gateway closed the connection: generation stops here
            raise
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", endless)
    async with serving(app) as url:
        engine.url = url
        yield engine


async def test_n_2_is_billed_as_two_completions(store: Store) -> None:
    async with (
        llama_like() as engine,
        running_gateway(store, FakeRouteSource(route("smol-0", engine.url))) as gw,
    ):
        response = await gw.chat(n=2, max_tokens=20)
        assert response.status_code == 200, response.text
        assert [c["index"] for c in response.json()["choices"]] == [0, 1]
        # The engine said 3 completion tokens; the second choice is billed at its max_tokens.
        assert await gw.usage_totals(1) == (PROMPT_TOKENS, 3 + 20)
        # And the answer says so, not the one choice's usage llama.cpp kept.
        usage = response.json()["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (PROMPT_TOKENS, 23)
        assert usage["total_tokens"] == PROMPT_TOKENS + 23


async def test_a_budget_holds_every_choice_of_a_request(store: Store) -> None:
    async with (
        llama_like() as engine,
        running_gateway(store, FakeRouteSource(route("smol-0", engine.url))) as gw,
    ):
        await store.set_key_limits(gw.key_id, KeyLimits(token_budget=2_000))
        deadline = time.monotonic() + 5
        while True:  # the gateway re-reads its keys every 0.1 s in these settings
            # One choice asking for more than the budget: clamped once the budget is known.
            response = await gw.chat(max_tokens=5_000)
            assert response.status_code == 200, response.text
            if engine.bodies[-1]["max_tokens"] < 5_000 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        response = await gw.chat(n=4, max_tokens=1_000)
        assert response.status_code == 200, response.text
        # Four choices of up to max_tokens each must fit in what is left of the budget
        # together (each request so far spent its prompt and 3 tokens of completion).
        forwarded = engine.bodies[-1]["max_tokens"]
        spent = (len(engine.bodies) - 1) * (PROMPT_TOKENS + len(WORDS))
        assert 0 < forwarded * 4 < 2_000 - spent


async def test_a_stream_with_two_choices_is_billed_for_both(store: Store) -> None:
    async with (
        llama_like() as engine,
        running_gateway(store, FakeRouteSource(route("smol-0", engine.url))) as gw,
    ):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2}
        async with gw.client.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=gw.auth
        ) as response:
            events = await sse_events(response)
        assert events[-1] == "[DONE]"
        # The engine reported one choice's three tokens; six went by.
        assert await gw.usage_totals(1) == (PROMPT_TOKENS, 2 * len(WORDS))
        assert not [e for e in events[:-1] if "usage" in json.loads(e)]  # not asked for

        # Asked for: one usage chunk, last before [DONE], saying what was billed.
        options = {"stream_options": {"include_usage": True}}
        async with gw.client.stream(
            "POST",
            "/v1/chat/completions",
            json={**body, "stream": True, **options},
            headers=gw.auth,
        ) as response:
            events = await sse_events(response)
        usages = [json.loads(e)["usage"] for e in events[:-1] if "usage" in json.loads(e)]
        assert len(usages) == 1
        assert json.loads(events[-2])["usage"] == usages[0]
        assert (usages[0]["prompt_tokens"], usages[0]["completion_tokens"]) == (
            PROMPT_TOKENS,
            2 * len(WORDS),
        )
        assert await gw.usage_totals(2) == (2 * PROMPT_TOKENS, 4 * len(WORDS))


# --- a client that reads one byte a second -----------------------------------------------


TCP_CLOSE = 7  # tcp_info.tcpi_state of a connection that is closed (here: reset)


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="reads Linux's TCP_INFO")
async def test_a_client_that_stops_reading_is_dropped_and_the_engine_stops(store: Store) -> None:
    timeout_s = 1.0
    settings = fast_settings(stream_write_timeout_s=timeout_s)
    async with (
        llama_like() as engine,
        running_gateway(store, FakeRouteSource(route("smol-0", engine.url)), settings) as gw,
    ):
        body = json.dumps({"model": MODEL, "prompt": "go", "stream": True}).encode()
        request = http_request(
            "POST",
            "/v1/completions",
            headers={**gw.auth, "Content-Type": "application/json"},
            body=body,
        )
        host, _, port = gw.url.removeprefix("http://").rpartition(":")
        sock = socket.socket()
        # A small receive window, so the kernel's buffers fill in a moment, as they would for
        # a client far away that reads nothing.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (host, int(port)))
        await loop.sock_sendall(sock, request)
        started = time.monotonic()
        received = b""
        dropped = False
        try:
            while not dropped and time.monotonic() - started < 30:
                try:
                    received += await asyncio.wait_for(loop.sock_recv(sock, 1), 2)
                except TimeoutError:
                    pass
                except ConnectionError:
                    dropped = True
                await asyncio.sleep(1)  # one byte a second
                # Reset by the gateway: what this reader's own buffer holds stays readable,
                # but the connection is gone (TCP_CLOSE).
                dropped |= sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE
        finally:
            sock.close()
        assert dropped, "the gateway kept streaming to a client that read one byte a second"
        assert received
        assert b"HTTP/1.1 200".startswith(received[:12])
        # Dropped once its buffers were full and a write then waited `timeout_s`: seconds,
        # not the hours this reader would take.
        assert time.monotonic() - started < 20
        # The engine saw the gateway close its request, long before it was done.
        await asyncio.wait_for(engine.gone.wait(), 5)
        assert engine.streamed < 200_000
        # What was streamed is billed: a token per chunk the gateway took from the engine.
        _prompt, completion = await gw.usage_totals(1)
        assert 0 < completion <= engine.streamed
        assert completion > 100  # far more than the client read; the engine made them all
