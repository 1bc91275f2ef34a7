"""An OTLP/HTTP receiver of spans, in the test's own process: what a collector gets from llmgw.

It serves POST /v1/traces as the OpenTelemetry protocol says (a protobuf
ExportTraceServiceRequest), decodes each span with the protocol's own generated classes and
keeps it as plain data, so a test reads what a real collector would store, not what an
exporter was handed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.gateway_kit import serving

SERVER, CLIENT = 2, 3  # the protocol's Span.SpanKind values


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # hex, as in a traceparent header
    span_id: str
    parent_id: str  # "" for a root span
    kind: int
    service: str
    attributes: dict[str, Any]
    events: list[str]
    error: bool


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


@dataclass
class Receiver:
    endpoint: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: int = 0

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.posts += 1
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            service=str(resource.get("service.name", "")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            events=[e.name for e in span.events],
                            error=span.status.code == 2,  # STATUS_CODE_ERROR
                        )
                    )

    def named(self, prefix: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    async def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while not done(self.spans):
            if time.monotonic() > deadline:
                names = sorted({s.name for s in self.spans})
                raise AssertionError(f"spans not received in {timeout_s}s; got {names}")
            await asyncio.sleep(0.05)
        return self.spans


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()

    async def traces(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf", request.content_type
        receiver.take(await request.read())
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    async with serving(app) as url:
        receiver.endpoint = url
        yield receiver
