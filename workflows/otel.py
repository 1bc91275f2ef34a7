"""OpenTelemetry traces for every llmgw process, off unless switched on (docs/tracing.md).

`LLMGW_OTLP_ENDPOINT` (or `--otlp-endpoint` where a command has it) names an OTLP/HTTP
receiver, e.g. http://collector:4318; spans are batched and posted to its /v1/traces. When it
is set, every Temporal client this process connects (workflows/client.py) carries Temporal's
own tracing interceptor, so a workflow, the activities and child workflows it starts, and the
signals sent to it are spans of one trace; the gateway adds its request spans
(gateway/tracing.py). When it is not set nothing here is imported beyond this module: no
provider, no interceptor, no exporter thread.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from temporalio.client import Interceptor

ENDPOINT_ENV = "LLMGW_OTLP_ENDPOINT"
TRACES_PATH = "/v1/traces"

_provider: TracerProvider | None = None
_traces_url = ""


def endpoint_from_env() -> str:
    return os.environ.get(ENDPOINT_ENV, "").strip()


def traces_url(endpoint: str) -> str:
    """The receiver's traces URL: OTLP/HTTP's /v1/traces under the endpoint, unless named."""
    base = endpoint.rstrip("/")
    if "://" not in base:
        raise ValueError(f"{ENDPOINT_ENV} must be an http(s) URL such as http://collector:4318")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def start(service: str, endpoint: str | None = None) -> bool:
    """Export this process's spans to `endpoint` (default: the environment's) as `service`;
    False, and nothing started, when no endpoint is given. Once per process: a second call
    keeps the first provider."""
    global _provider, _traces_url
    url = endpoint if endpoint is not None else endpoint_from_env()
    if not url:
        return False
    if _provider is not None:
        return True
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {
            "service.name": service,
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
        }
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(url))))
    trace.set_tracer_provider(provider)
    _provider, _traces_url = provider, traces_url(url)
    return True


def enabled() -> bool:
    return _provider is not None


def current_traces_url() -> str:
    """Where this process sends its spans; "" when it does not trace. A node agent hands it to
    the engines that trace themselves (vLLM), so their spans reach the same receiver."""
    return _traces_url


def tracer(name: str) -> Any:
    """A tracer of this process's provider (opentelemetry.trace.Tracer); only once started."""
    if _provider is None:
        raise RuntimeError("tracing is not started in this process")
    return _provider.get_tracer(name)


def shutdown() -> None:
    """Send what is batched and stop the exporter (at a process's orderly exit)."""
    global _provider, _traces_url
    if _provider is not None:
        _provider.shutdown()
        _provider, _traces_url = None, ""


def temporal_interceptors() -> list[Interceptor]:
    """Temporal's tracing interceptor when this process traces, else none. Workflow spans are
    made even for workflows started without a traced caller (schedules, the CLI, the UI): a
    replica's launch is one trace from the model workflow's start of it to ready."""
    if _provider is None:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor(tracer("llmgw.temporal"), always_create_workflow_spans=True)]
