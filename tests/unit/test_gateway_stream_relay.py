"""The streaming relay's own shortcuts, as an engine and a client see them: the body a stream
sends upstream is the client's own plus the usage option, a stream ends with its [DONE] and
the engine's connection is kept for the next request; and when the wait for an engine's answer
needs a timer of the request's own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gateway.body_parse import with_member
from gateway.upstream_post import needs_own_timer
from store import Store
from tests.gateway_kit import MODEL, FakeRouteSource, route, running_gateway, serving, sse_events

MESSAGES = [{"role": "user", "content": "tell me about otters ü"}]


def _event(data: dict[str, Any] | str) -> bytes:
    return b"data: " + (data if isinstance(data, str) else json.dumps(data)).encode() + b"\n\n"


@dataclass
class Engine:
    """Streams two tokens, a usage chunk and [DONE]; notes each request's raw body and the
    port of the connection it came on."""

    raw_bodies: list[bytes] = field(default_factory=list)
    peer_ports: list[int] = field(default_factory=list)
    url: str = ""
    # How long the chunked terminator waits after [DONE].
    end_after_s: float = 0.0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.raw_bodies.append(await request.read())
        assert request.transport is not None
        self.peer_ports.append(request.transport.get_extra_info("peername")[1])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for text in ("otters ", "swim"):
            delta = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            await response.write(_event({"object": "chat.completion.chunk", "choices": [delta]}))
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        await response.write(_event({"choices": [], "usage": usage}) + _event("[DONE]"))
        # The chunked terminator follows when this returns.
        await asyncio.sleep(self.end_after_s)
        return response


@asynccontextmanager
async def engine(end_after_s: float = 0.0) -> AsyncIterator[Engine]:
    upstream = Engine(end_after_s=end_after_s)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.handle)
    async with serving(app) as url:
        upstream.url = url
        yield upstream


@pytest.mark.parametrize(
    ("options", "sent_options"),
    [
        (None, {"include_usage": True}),
        ({"continuous_usage_stats": True}, {"continuous_usage_stats": True, "include_usage": True}),
    ],
)
async def test_a_stream_reaches_the_engine_as_sent_with_usage_asked_for(
    store: Store, options: dict[str, Any] | None, sent_options: dict[str, Any]
) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": True,
        "temperature": 0.25,
        "some_engine_option": [1, {"x": None}],
    }
    if options is not None:
        body["stream_options"] = options
    async with engine() as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with (
            running_gateway(store, source) as gw,
            gw.client.stream(
                "POST", "/v1/chat/completions", json=body, headers=gw.auth
            ) as response,
        ):
            events = await sse_events(response)
    sent = json.loads(upstream.raw_bodies[0])
    assert sent == {**body, "stream_options": sent_options}
    # The client did not ask for usage: it sees the tokens and [DONE], not the usage chunk.
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == [
        "otters ",
        "swim",
    ]


@pytest.mark.parametrize("end_after_s", [0.0, 0.1])
async def test_streams_one_after_another_keep_the_engine_connection(
    store: Store, end_after_s: float
) -> None:
    """A client's response ends once the engine's has, whether its end came with [DONE] or a
    moment later: the engine's connection then goes back to the pool, not closed with it."""
    async with engine(end_after_s) as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with running_gateway(store, source) as gw:
            for _ in range(3):
                async with gw.client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": MESSAGES, "stream": True},
                    headers=gw.auth,
                ) as response:
                    assert (await sse_events(response))[-1] == "[DONE]"
            assert await gw.usage_totals(3) == (15, 6)
    assert len(upstream.peer_ports) == 3
    assert len(set(upstream.peer_ports)) == 1, upstream.peer_ports


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"model":"m"}', b'{"model":"m","n":1}'),
        (b'{ "model" : "m" }\r\n ', b'{ "model" : "m","n":1}'),
        (b"{}", b'{"n":1}'),
        (b"{ \n}", b'{"n":1}'),
    ],
)
def test_a_member_is_added_to_the_clients_own_bytes(raw: bytes, expected: bytes) -> None:
    added = with_member(raw, b'"n":1')
    assert added == expected
    assert json.loads(added) == {**json.loads(raw), "n": 1}


def test_adding_a_member_to_what_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        with_member(b'["model"]', b'"n":1')


@pytest.mark.parametrize(
    ("remaining", "read_timeout", "own_timer"),
    [
        (599.99, 600.0, False),  # the default deadline, less the time admission took
        (599.5, 600.0, False),
        (598.0, 600.0, True),  # a client's own, shorter timeout
        (30.0, 600.0, True),
        (9.95, 10.0, False),
        (9.8, 10.0, True),  # a short read timeout gets a proportionally short slack
        (1.0, 1.5, True),
        (700.0, 600.0, False),
    ],
)
def test_only_a_deadline_shorter_than_the_read_timeout_gets_a_timer(
    remaining: float, read_timeout: float, own_timer: bool
) -> None:
    assert needs_own_timer(remaining, read_timeout) is own_timer
