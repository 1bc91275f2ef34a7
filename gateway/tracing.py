"""The request path's spans (docs/tracing.md): made only when the gateway traces.

`state.tracing` is None otherwise, and each place in the request path that records something
is one `is not None` test away from doing nothing, so a gateway that does not trace pays that
test and no more (measured in `make bench-gateway`).

One SERVER span per proxied request, joined to the caller's trace when the request carries a
W3C `traceparent`: the key (its id, never the secret), the model, then a `queue` span for the
time the fair queue held it, one CLIENT span per replica tried with the routing decision
(replica, node, engine, reason, routing state, predicted cached tokens) and the upstream
status, an event at the first streamed token, and the usage settled. The engine gets the
attempt's `traceparent`, so an engine that traces (vLLM with --otlp-traces-endpoint) adds its
spans under it. The spans ride OpenTelemetry's context (a contextvar), which the request's task
keeps from the handler down to the relay's last byte.
"""

from __future__ import annotations

import time
from contextvars import Token

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode
from starlette.types import Scope

from workflows import otel
from workflows.contracts import Route

TRACE_HEADERS = (b"traceparent", b"tracestate")


class RequestTracing:
    """Makes and annotates the spans of this gateway's requests."""

    def __init__(self) -> None:
        self._tracer = otel.tracer("llmgw.gateway")

    def start(self, scope: Scope) -> tuple[Span, Token[Context]]:
        """The request's span, made current; the token detaches it (`end`)."""
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in TRACE_HEADERS
        }
        parent = propagate.extract(carrier) if carrier else None
        path = scope["path"]
        span = self._tracer.start_span(
            f"POST {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "url.path": path},
        )
        token = context.attach(trace.set_span_in_context(span))
        return span, token

    @staticmethod
    def end(span: Span, token: Token[Context], status: int, model: str) -> None:
        span.set_attribute("http.response.status_code", status)
        if model != "-":
            span.set_attribute("gen_ai.request.model", model)
        if status >= 500:
            span.set_status(StatusCode.ERROR)
        span.end()
        context.detach(token)

    @staticmethod
    def admitted(key_id: str, key_name: str, stream: bool, prompt_estimate: int) -> None:
        span = trace.get_current_span()
        span.set_attribute("llmgw.key.id", key_id)
        span.set_attribute("llmgw.key.name", key_name)
        span.set_attribute("llmgw.stream", stream)
        span.set_attribute("llmgw.prompt_tokens.estimate", prompt_estimate)

    def queued(self, waited_s: float, priority: int) -> None:
        """The fair queue held the request `waited_s`: a span ending now."""
        end = time.time_ns()
        span = self._tracer.start_span(
            "queue",
            start_time=end - int(waited_s * 1e9),
            attributes={"llmgw.queue.waited_s": waited_s, "llmgw.priority": priority},
        )
        span.end(end_time=end)

    def attempt(
        self,
        route: Route,
        reason: str,
        routing_state: str,
        predicted_cached: int | None,
        headers: dict[str, str],
    ) -> UpstreamAttempt:
        """A span for sending to `route`, its trace context put in `headers` for the engine."""
        span = self._tracer.start_span(
            f"upstream {route.engine}",
            kind=SpanKind.CLIENT,
            attributes={
                "llmgw.replica": route.replica_id,
                "llmgw.node": route.node,
                "llmgw.engine": route.engine,
                "llmgw.routing.reason": reason,
                "llmgw.routing.state": routing_state,
            },
        )
        if predicted_cached is not None:
            span.set_attribute("llmgw.routing.predicted_cached_tokens", predicted_cached)
        propagate.inject(headers, context=trace.set_span_in_context(span))
        return UpstreamAttempt(span)

    @staticmethod
    def first_token(ttft_s: float) -> None:
        trace.get_current_span().add_event("first_token", {"llmgw.ttft_s": ttft_s})

    @staticmethod
    def settled(prompt: int, completion: int, estimated: bool) -> None:
        span = trace.get_current_span()
        span.set_attribute("gen_ai.usage.input_tokens", prompt)
        span.set_attribute("gen_ai.usage.output_tokens", completion)
        span.set_attribute("llmgw.usage.estimated", estimated)

    @staticmethod
    def cached(reported: int) -> None:
        trace.get_current_span().set_attribute("llmgw.cached_tokens", reported)


class UpstreamAttempt:
    """One replica tried: its span, ended once the engine's answer starts or the try fails."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def answered(self, status: int | None, failure: str = "") -> None:
        """The engine's status once its answer started, or why the try failed."""
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
        if failure:
            self.span.set_attribute("llmgw.upstream.failure", failure)
            self.span.set_status(StatusCode.ERROR, failure)
        self.span.end()
