"""The proxied OpenAI routes, end to end: who is calling, what they ask, which replica answers.

One request goes: lockout check, key, body, validation, allowlists, quota reservation, routing,
the upstream hop (retried on another replica while no byte has come back and the deadline
allows), the relay, then accounting (usage, quota settlement, metrics) exactly once.

The client's own headers never travel upstream: the gateway builds the engine request from the
validated body and the replica's key only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass

import aiohttp
from starlette.types import Receive, Scope, Send

from gateway.asgi import headers_of, read_body, send_error
from gateway.auth import ensure_adapter_allowed, ensure_model_allowed
from gateway.deps import GatewayState
from gateway.errors import SERVER_ERROR, ApiError
from gateway.prompt_estimate import estimate_prompt_tokens
from gateway.quota import Denied, Reservation
from gateway.relay import Accounting, ClientWatch, Relay
from gateway.request_body import (
    EMBEDDINGS,
    ProxiedRequest,
    parse_json_object,
    parse_proxied_request,
    requested_model,
)
from gateway.routing import RequestKey, RoutingSnapshot, prompt_bytes
from gateway.store import ApiKey
from workflows.contracts import Route

log = logging.getLogger(__name__)

RETRY_AFTER_S = "2"
# nginx's status for "the client closed the request": what the metrics record when it did.
CLIENT_CLOSED = 499
# How often a held request looks for a ready replica of the model it woke.
WAKE_POLL_S = 0.2
# Sent by OpenAI's SDKs with the client's own timeout: retries must fit inside it.
CLIENT_TIMEOUT_HEADER = b"x-stainless-timeout"
SESSION_HEADER = b"x-session-id"
WANTED_HEADERS = frozenset(
    {b"authorization", b"content-length", CLIENT_TIMEOUT_HEADER, SESSION_HEADER}
)
# Statuses that mean "this replica cannot take it now", not "this request is wrong": another
# replica may well serve it.
RETRYABLE_STATUSES = frozenset({502, 503, 504})


def upstream_url(route: Route, path: str) -> str:
    """The ledger gives an endpoint such as http://10.0.0.5:18000 (a trailing /v1 or a missing
    scheme are tolerated); `path` starts with / (/v1/..., or an engine's metrics path)."""
    base = route.endpoint.rstrip("/")
    if "://" not in base:
        base = "http://" + base
    base = base.removesuffix("/v1")
    return base + path


class Outcome:
    """What the request-level metrics need, filled in as the request goes."""

    __slots__ = ("model", "status")

    def __init__(self) -> None:
        self.model = "-"  # a label only once the model is known to exist: bounded cardinality
        self.status = 500


async def handle_proxied(state: GatewayState, scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI handler for POST /v1/chat/completions, /v1/completions and /v1/embeddings."""
    started = time.perf_counter()
    outcome = Outcome()
    metrics = state.metrics
    metrics.in_flight.inc()
    try:
        outcome.status = await _serve(state, scope, receive, send, started, outcome)
    except ApiError as err:
        outcome.status = err.status
        await send_error(send, err)
    finally:
        metrics.in_flight.dec()
        metrics.request(outcome.model, scope["path"], outcome.status, time.perf_counter() - started)


@dataclass(frozen=True)
class Admitted:
    """A request that passed the door: who sent it, what it asks, and the bytes it came as."""

    key: ApiKey
    request: ProxiedRequest
    raw: bytes
    headers: dict[bytes, bytes]


async def _admit(state: GatewayState, scope: Scope, receive: Receive) -> Admitted:
    """Lockout, key, body, model and adapter allowlists, then the body's fields: each refusal
    as early as it can be known, and before anything costs an engine a thing."""
    client = scope["client"][0] if scope.get("client") else ""
    now = time.monotonic()
    locked_for = state.lockout.retry_after(client, now)
    if locked_for is not None:
        state.metrics.auth_failed("locked_out")
        raise ApiError(
            429,
            "Too many failed authentication attempts from this address; try again later.",
            code="too_many_auth_failures",
            headers={"Retry-After": str(math.ceil(locked_for))},
        )
    headers = headers_of(scope, WANTED_HEADERS)
    authorization = headers.get(b"authorization")
    try:
        key = await state.keys.authenticate(
            authorization.decode("latin-1") if authorization else None
        )
    except ApiError as err:
        if err.status == 401:
            state.lockout.failed(client, now)
            state.metrics.auth_failed("invalid_key")
        raise
    raw = await read_body(receive, state.settings.max_body_bytes, headers.get(b"content-length"))
    body = parse_json_object(raw)
    model, adapter = requested_model(body)
    ensure_model_allowed(key, model)
    ensure_adapter_allowed(key, adapter)
    return Admitted(key, parse_proxied_request(scope["path"], body), raw, headers)


async def _serve(
    state: GatewayState,
    scope: Scope,
    receive: Receive,
    send: Send,
    started: float,
    outcome: Outcome,
) -> int:
    admitted = await _admit(state, scope, receive)
    key, request, raw, headers = admitted.key, admitted.request, admitted.raw, admitted.headers
    snapshot = await _routable_snapshot(state, request.model)
    outcome.model = request.model
    deadline = started + _deadline_s(state, headers.get(CLIENT_TIMEOUT_HEADER))

    body = request.body
    prompt_estimate = estimate_prompt_tokens(body)
    reservation, clamped = _reserve(state, key, request, prompt_estimate)
    upstream_model = snapshot.upstream_model(request.model)
    changed = clamped or request.adapter is not None or request.stream or bool(upstream_model)
    if request.adapter is not None:
        # Engines serve a LoRA adapter under its own name.
        body["model"] = request.adapter
    elif upstream_model:
        # An external endpoint that knows the model by another name (catalog: upstream_model).
        body["model"] = upstream_model
    if request.stream:
        # Always ask for usage, so a streamed request is accounted like any other.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    accounting = Accounting(state, key, request.model, reservation, prompt_estimate)
    watch = ClientWatch(receive)
    try:
        # An unchanged body goes upstream as the client's own bytes: no second serialisation.
        payload = json.dumps(body, separators=(",", ":")).encode() if changed else raw
        session = headers.get(SESSION_HEADER)
        routing_key = RequestKey(
            model=request.model,
            prompt=prompt_bytes(body),
            session=session.decode("latin-1") if session else request.user,
        )
        try:
            relay = await _first_answer(
                state, request, snapshot, routing_key, payload, deadline, watch
            )
        except BaseException:
            if watch.gone:
                accounting.settle(None)  # the engine may have had the prompt
            else:
                accounting.settle_failed()
            raise
        return await relay.run(send, accounting, started)
    except asyncio.CancelledError:
        if not watch.gone:
            raise
        # The client left: the normal end of this request, not an error.
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        return CLIENT_CLOSED
    finally:
        watch.stop()


def _deadline_s(state: GatewayState, client_timeout: bytes | None) -> float:
    deadline = state.settings.request_deadline_s
    if client_timeout:
        with contextlib.suppress(ValueError):
            deadline = min(deadline, float(client_timeout))
    return deadline


def _reserve(
    state: GatewayState, key: ApiKey, request: ProxiedRequest, prompt_estimate: int
) -> tuple[Reservation, bool]:
    """Reserve this request's worst case against the key's limits, and clamp its max_tokens so
    the worst case really is the worst case (an engine stops at max_tokens). True when the
    body was changed."""
    clamped = False
    body = request.body
    now = time.time()
    if request.path == EMBEDDINGS:
        verdict = state.quota.reserve(key.key_id, key.limits, prompt_estimate, now)
    else:
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        requested = body.get(field)
        verdict = state.quota.reserve_completion(
            key.key_id,
            key.limits,
            prompt_estimate,
            requested if isinstance(requested, int) else None,
            now,
            context_tokens=state.settings.assumed_context_tokens,
        )
        if isinstance(verdict, Reservation) and verdict.max_tokens is not None:
            clamped = body.get(field) != verdict.max_tokens
            body[field] = verdict.max_tokens
    if isinstance(verdict, Denied):
        state.metrics.quota_rejected(verdict.reason)
        raise _quota_error(verdict.reason, verdict.message, verdict.retry_after_s)
    return verdict, clamped


def _quota_error(reason: str, message: str, retry_after_s: float | None) -> ApiError:
    headers = (
        {} if retry_after_s is None else {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
    )
    return ApiError(429, message, type_="rate_limit_error", code=f"quota_{reason}", headers=headers)


async def _routable_snapshot(state: GatewayState, model: str) -> RoutingSnapshot:
    snapshot = state.routes.snapshot
    if not snapshot.knows(model) and state.routes.last_success is None:
        # A gateway that has not read the routing table yet cannot say a model does not exist.
        raise ApiError(
            503,
            "The gateway is still loading its routing table; try again shortly.",
            type_=SERVER_ERROR,
            code="routes_not_loaded",
            headers={"Retry-After": RETRY_AFTER_S},
        )
    if not snapshot.knows(model):
        raise ApiError(
            404, f"The model '{model}' does not exist.", param="model", code="model_not_found"
        )
    cold_start = state.settings.cold_start_timeout_s
    if not snapshot.ready(model) and (
        snapshot.is_idle(model) or state.routes.warming(model, cold_start)
    ):
        snapshot = await wait_for_replica(state, model, cold_start)
    return snapshot


async def wait_for_replica(state: GatewayState, model: str, timeout_s: float) -> RoutingSnapshot:
    """Hold a request for a model at zero replicas: wake it, then wait for the routing table to
    show a ready replica (it refreshes in the background), up to the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        await state.routes.wake(model)
        snapshot = state.routes.snapshot
        if snapshot.ready(model):
            return snapshot
        if loop.time() >= deadline:
            raise ApiError(
                503,
                f"The model '{model}' is starting from zero replicas; try again shortly.",
                type_=SERVER_ERROR,
                param="model",
                code="model_starting",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        await asyncio.sleep(WAKE_POLL_S)


async def _first_answer(
    state: GatewayState,
    request: ProxiedRequest,
    snapshot: RoutingSnapshot,
    routing_key: RequestKey,
    payload: bytes,
    deadline: float,
    watch: ClientWatch,
) -> Relay:
    """Send to the chosen replica; while nothing has come back, a failure moves the request to
    another replica, as long as the deadline allows. Once a response has started, it is the
    answer, whatever it says."""
    model = request.model
    tried: list[str] = []
    failure: str | None = None
    while True:
        decision = state.router.choose(snapshot, routing_key, state.inflight.counts, tried)
        route = decision.route
        if route is None:
            break
        if tried:
            state.metrics.retry(model)
        state.metrics.routed(model, decision.reason)
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            failure = failure or "deadline"
            break
        state.inflight.acquire(route.replica_id)
        try:
            upstream = await _post(state, route, request, payload, remaining)
        except (aiohttp.ClientError, TimeoutError) as exc:
            state.inflight.release(route.replica_id)
            reason = "timeout" if isinstance(exc, TimeoutError) else "unreachable"
            _failed(state, model, route, reason, exc)
            tried.append(route.replica_id)
            failure = reason
            continue
        except BaseException:
            state.inflight.release(route.replica_id)
            raise
        if upstream.status in RETRYABLE_STATUSES:
            detail = f"answered {upstream.status}"
            upstream.release()
            state.inflight.release(route.replica_id)
            _failed(state, model, route, f"status_{upstream.status}", detail)
            tried.append(route.replica_id)
            failure = "unavailable"
            continue
        state.router.breaker.succeeded(route.replica_id, time.monotonic())
        return Relay(state, model, route, upstream, request.stream, request.wants_usage, watch)

    if failure is None:
        raise ApiError(
            503,
            f"The model '{model}' has no ready replica right now; try again shortly.",
            type_=SERVER_ERROR,
            param="model",
            code="no_ready_replica",
            headers={"Retry-After": RETRY_AFTER_S},
        )
    if failure in ("timeout", "deadline"):
        raise ApiError(
            504,
            f"No replica of the model '{model}' answered within the request's deadline.",
            type_=SERVER_ERROR,
            code="upstream_timeout",
        )
    raise ApiError(
        502,
        f"No replica of the model '{model}' could serve the request.",
        type_=SERVER_ERROR,
        code="upstream_unreachable",
    )


def _failed(state: GatewayState, model: str, route: Route, reason: str, detail: object) -> None:
    log.warning("replica %s failed before answering (%s): %s", route.replica_id, reason, detail)
    state.metrics.upstream_error(model, reason)
    state.router.breaker.failed(route.replica_id, time.monotonic())


async def _post(
    state: GatewayState, route: Route, request: ProxiedRequest, payload: bytes, remaining: float
) -> aiohttp.ClientResponse:
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream" if request.stream else "application/json",
    }
    secret = state.upstream_auth(route)
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    url = upstream_url(route, request.path)
    if remaining >= state.settings.upstream_read_timeout_s:
        # The usual case: the deadline is no shorter than the session's own timeouts, which
        # then bound the wait without a timer of this request's own.
        return await state.session.post(url, data=payload, headers=headers)
    # Until the response starts: bounded by the request's deadline, so a hung replica still
    # leaves time to try another. Reads after that follow the session's read timeout.
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=min(state.settings.upstream_connect_timeout_s, remaining),
        sock_read=state.settings.upstream_read_timeout_s,
    )
    async with asyncio.timeout(remaining):
        return await state.session.post(url, data=payload, headers=headers, timeout=timeout)
