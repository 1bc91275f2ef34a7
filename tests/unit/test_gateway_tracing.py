"""The request path's traces as a collector receives them over OTLP/HTTP: the caller's trace
joined, the routing decision and each replica tried, the engine handed the trace context, the
usage settled; and with tracing off, nothing sent and no trace header reaching an engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from store import Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    fast_settings,
    recording_upstream,
    route,
    running_gateway,
    serving,
)
from tests.otlp_receiver import CLIENT, SERVER, ReceivedSpan, otlp_receiver
from workflows import otel

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens


def request_span(spans: list[ReceivedSpan]) -> ReceivedSpan:
    (span,) = [s for s in spans if s.kind == SERVER and s.name == "POST /v1/chat/completions"]
    return span


async def test_a_request_is_one_trace_from_the_caller_to_the_engine(store: Store) -> None:
    async with otlp_receiver() as receiver, recording_upstream() as engine:
        # The dead replica is tried first (round robin, in table order), then the live one.
        source = FakeRouteSource(route("smol-0", DEAD), route("smol-1", engine.url))
        settings = fast_settings(otlp_endpoint=receiver.endpoint, routing_policy="round_robin")
        async with running_gateway(store, source, settings) as gw:
            assert otel.enabled()
            response = await gw.client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "otters?"}]},
                headers={**gw.auth, "traceparent": TRACEPARENT},
            )
            assert response.status_code == 200, response.text
            api_key, key_id = gw.api_key, gw.key_id
        # The gateway's shutdown sends what it batched.
        spans = await receiver.wait_for(lambda got: any(s.kind == SERVER for s in got))
    assert not otel.enabled()

    served = request_span(spans)
    assert (served.trace_id, served.parent_id) == (CALLER_TRACE, CALLER_SPAN)
    assert served.service == "llmgw-gateway"
    assert served.attributes["gen_ai.request.model"] == MODEL
    assert served.attributes["llmgw.key.id"] == key_id
    assert served.attributes["http.response.status_code"] == 200
    assert served.attributes["gen_ai.usage.input_tokens"] == 4
    assert served.attributes["gen_ai.usage.output_tokens"] == 2
    assert served.attributes["llmgw.usage.estimated"] is False

    attempts = [s for s in spans if s.kind == CLIENT]
    assert [s.parent_id for s in attempts] == [served.span_id] * 2
    failed, answered = sorted(attempts, key=lambda s: s.attributes["llmgw.replica"])
    assert failed.attributes["llmgw.replica"] == "smol-0"
    assert failed.error
    assert "llmgw.upstream.failure" in failed.attributes
    assert answered.attributes["llmgw.replica"] == "smol-1"
    assert answered.attributes["http.response.status_code"] == 200
    assert answered.attributes["llmgw.routing.reason"] == "round_robin"
    assert answered.attributes["llmgw.engine"] == "llamacpp"
    assert not answered.error

    # The engine got the trace context of the attempt that reached it, and the caller's
    # own header never travelled upstream as such.
    ((headers, _body),) = engine.seen
    assert headers["traceparent"] == f"00-{CALLER_TRACE}-{answered.span_id}-01"
    # No secret in any span.
    for span in spans:
        assert api_key not in json.dumps(span.attributes, default=str)


@asynccontextmanager
async def streaming_engine() -> AsyncIterator[str]:
    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk: dict[str, Any] = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
        for event in (chunk, usage):
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serving(app) as url:
        yield url


async def test_a_streamed_request_marks_its_first_token(store: Store) -> None:
    async with otlp_receiver() as receiver, streaming_engine() as url:
        settings = fast_settings(otlp_endpoint=receiver.endpoint)
        async with running_gateway(store, FakeRouteSource(route("smol-0", url)), settings) as gw:
            response = await gw.client.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "stream": True,
                    "messages": [{"role": "user", "content": "a"}],
                },
                headers=gw.auth,
            )
            assert response.status_code == 200
        spans = await receiver.wait_for(lambda got: any(s.kind == SERVER for s in got))
    served = request_span(spans)
    assert served.parent_id == ""  # no caller trace: a trace of its own
    assert "first_token" in served.events
    assert served.attributes["llmgw.stream"] is True
    assert served.attributes["gen_ai.usage.input_tokens"] == 7


async def test_with_tracing_off_nothing_is_sent_and_engines_get_no_trace_header(
    store: Store,
) -> None:
    async with otlp_receiver() as receiver, recording_upstream() as engine:
        source = FakeRouteSource(route("smol-0", engine.url))
        async with running_gateway(store, source) as gw:
            assert not otel.enabled()
            response = await gw.client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "otters?"}]},
                headers={**gw.auth, "traceparent": TRACEPARENT},
            )
            assert response.status_code == 200
    ((headers, _body),) = engine.seen
    assert "traceparent" not in {h.lower() for h in headers}
    assert receiver.posts == 0
