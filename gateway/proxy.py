"""The proxied OpenAI routes, end to end: who is calling, what they ask, which replica answers.

One request goes: lockout check, key, body, model and adapter allowlists, the body's fields and
request limits, the key's prompt tokens in flight, the model's routes (404, 503, or held while a
model at zero replicas wakes), the key's prefix-cache salt (gateway/cache_salt.py), quota
reservation, the fair queue (gateway/admission/), routing and the upstream hop, retried on
another replica while no byte has come back and the deadline allows
(gateway/replica_attempts.py), the relay, then accounting (usage, quota settlement, metrics)
exactly once.

The client's own headers never travel upstream: the gateway builds the engine request from the
validated body and the replica's key only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from gateway.admission import Pass
from gateway.admission.priority import PRIORITY_FIELD, PRIORITY_HEADER, request_priority
from gateway.asgi import headers_of, read_body, send_error
from gateway.auth import AuthFailed, ensure_adapter_allowed, ensure_model_allowed
from gateway.billing import choices_requested, completion_length
from gateway.body_parse import upstream_payload, with_member
from gateway.cache_salt import salt_body, salted_prompt
from gateway.deps import GatewayState
from gateway.errors import REQUEST_ID_HEADER, SERVER_ERROR, ApiError
from gateway.lockout import stored_group
from gateway.lora import UpstreamBodies, ensure_adapter_served
from gateway.observe.record import RequestRecord
from gateway.quota import Denied, Reservation
from gateway.relay import Accounting, ClientWatch
from gateway.replica_attempts import RETRY_AFTER_S, first_answer
from gateway.request_body import (
    EMBEDDINGS,
    ProxiedRequest,
)
from gateway.request_limits import RequestLimits, check_request
from gateway.routing import RequestKey, RoutingSnapshot, prompt_bytes
from gateway.shared_limits import Attempt, HeldLimits, Need
from gateway.tokenize import PromptTokens, TokensLater, cache_salt, request_token_ids
from store import ApiKey

log = logging.getLogger(__name__)

# nginx's status for "the client closed the request": what the metrics record when it did.
CLIENT_CLOSED = 499
# How often a held request looks for a ready replica of the model it woke.
WAKE_POLL_S = 0.2
# Sent by OpenAI's SDKs with the client's own timeout: retries must fit inside it.
CLIENT_TIMEOUT_HEADER = b"x-stainless-timeout"
SESSION_HEADER = b"x-session-id"
WANTED_HEADERS = frozenset(
    {b"authorization", b"content-length", CLIENT_TIMEOUT_HEADER, SESSION_HEADER, PRIORITY_HEADER}
)
# What every stream asks of its engine (as its stream_options; see _serve_admitted).
USAGE_OPTION = b'"stream_options":{"include_usage":true}'
# The completion a queued request is charged for until it ends: its max_tokens, up to this.
QUEUE_COMPLETION_GUESS = 1024


class Outcome:
    """What the request-level metrics need, filled in as the request goes, and the request
    log's record of it (gateway/observe/), made only while the log is on."""

    __slots__ = ("model", "record", "status")

    def __init__(self, record: RequestRecord | None) -> None:
        self.model = "-"  # a label only once the model is known to exist: bounded cardinality
        self.status = 500
        self.record = record


async def handle_proxied(state: GatewayState, scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI handler for POST /v1/chat/completions, /v1/completions and /v1/embeddings."""
    started = time.perf_counter()
    request_log = state.request_log
    record = None
    if request_log is not None:
        record = RequestRecord(scope["path"])
    outcome = Outcome(record)
    metrics = state.metrics
    metrics.in_flight.value += 1
    tracing = state.tracing
    if tracing is not None:
        span, token = tracing.start(scope)
    try:
        outcome.status = await _serve(state, scope, receive, send, started, outcome)
    except ApiError as err:
        outcome.status = err.status
        if record is not None:
            record.error_code = err.code
            err.headers[REQUEST_ID_HEADER] = record.request_id
        await send_error(send, err)
    finally:
        metrics.in_flight.value -= 1
        elapsed = time.perf_counter() - started
        metrics.request(outcome.model, scope["path"], outcome.status, elapsed)
        if record is not None:
            assert request_log is not None
            record.status = outcome.status
            record.total_s = elapsed
            # Charted under its model only once the model is known to exist (bounded series).
            request_log.add(record, outcome.model != "-")
        if tracing is not None:
            tracing.end(span, token, outcome.status, outcome.model)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that passed the door: who sent it, what it asks, the bytes it came as, and
    the request limits that apply to its key."""

    key: ApiKey
    request: ProxiedRequest
    raw: bytes
    headers: dict[bytes, bytes]
    limits: RequestLimits


async def _admit(state: GatewayState, scope: Scope, receive: Receive) -> Admitted:
    """Lockout, key, body, model and adapter allowlists, then the body's fields: each refusal
    as early as it can be known, and before anything costs an engine a thing."""
    client = scope["client"][0] if scope.get("client") else ""
    now = time.monotonic()
    state.limits.check_store(time.time())
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
    except AuthFailed as err:
        locked_for = state.lockout.failed(client, now)
        if locked_for is not None:
            # The other gateways on the store lock this client out too.
            state.limits.locked_out(stored_group(client), locked_for)
        state.metrics.auth_failed(err.reason)
        raise
    raw = await read_body(receive, state.settings.max_body_bytes, headers.get(b"content-length"))
    limits = RequestLimits.effective(state.settings, key.limits)
    # Large bodies are parsed in a worker process (gateway/body_parse.py); the allowlists still
    # answer before any other field is judged.
    request = await state.body_parser.parse(
        scope["path"], raw, functools.partial(_allowed, key), functools.partial(_limited, limits)
    )
    return Admitted(key, request, raw, headers, limits)


def _allowed(key: ApiKey, model: str, adapter: str | None) -> None:
    ensure_model_allowed(key, model)
    ensure_adapter_allowed(key, adapter)


def _limited(limits: RequestLimits, request: ProxiedRequest) -> None:
    # Module level: for a large body it runs in a body-parsing worker, so it must pickle.
    assert request.prompt_estimate is not None  # body_parse.prepare sets it before checks
    check_request(request.path, request.body, request.prompt_estimate, limits)


async def _serve(
    state: GatewayState,
    scope: Scope,
    receive: Receive,
    send: Send,
    started: float,
    outcome: Outcome,
) -> int:
    admitted = await _admit(state, scope, receive)
    key, request, limits = admitted.key, admitted.request, admitted.limits
    assert request.prompt_estimate is not None  # set by the body's preparation
    if state.tracing is not None:
        state.tracing.admitted(key.key_id, key.name, request.stream, request.prompt_estimate)
    if outcome.record is not None:
        outcome.record.admitted(key, request)
    # Held from before the routing table is read (a request waiting on a cold start counts) to
    # the relay's last byte or the client's leaving; a 429 here costs no quota.
    with state.key_inflight.held(
        key.key_id, request.prompt_estimate, limits.max_inflight_prompt_tokens
    ):
        return await _serve_admitted(state, admitted, receive, send, started, outcome)


async def _serve_admitted(
    state: GatewayState,
    admitted: Admitted,
    receive: Receive,
    send: Send,
    started: float,
    outcome: Outcome,
) -> int:
    key, request, raw, headers = admitted.key, admitted.request, admitted.raw, admitted.headers
    # Taken out of the body: engines read `priority` their own way (gateway/admission/priority).
    asked_priority = PRIORITY_FIELD in request.body
    priority = request_priority(headers.get(PRIORITY_HEADER), request.body, key.limits.top_priority)
    snapshot = await _routable_snapshot(state, request.model)
    outcome.model = request.model
    # A llama.cpp replica serves only the adapters it loaded (gateway/lora.py).
    ensure_adapter_served(request.model, request.adapter, snapshot.ready(request.model))
    deadline = started + _deadline_s(state, headers.get(CLIENT_TIMEOUT_HEADER))

    body = request.body
    prompt_estimate = request.prompt_estimate
    assert prompt_estimate is not None  # set by the body's preparation
    # The key's own prefix-cache salt (isolate_cache, vLLM replicas only), before anything is
    # reserved: a client's salt too long to take it is a 400. The routing key below uses it.
    salt = salt_body(state.cache_salts, key, body, snapshot.ready(request.model))
    watch = ClientWatch(receive)
    try:
        reservation, clamped = await _reserve(state, key, request, prompt_estimate)
        accounting = Accounting(state, key, request.model, reservation, prompt_estimate)
        accounting.record = outcome.record
        routing_key: RequestKey | None = None  # built once no engine can have the prompt yet
        admission: Pass | None = None
        try:
            # Quota first: a key past its limits is told at once, not after waiting its turn.
            admission = await state.admission.enter(
                request.model,
                key.key_id,
                priority,
                _queue_cost(request, prompt_estimate),
                key.limits.weight,
                deadline - time.perf_counter(),
                key.name,
            )
            if outcome.record is not None:
                outcome.record.queue_s = admission.waited_s
            if admission.waited_s:
                snapshot = state.routes.snapshot  # the table may have changed meanwhile
                if state.tracing is not None:
                    state.tracing.queued(admission.waited_s, priority)
            # From here to the relay's end, whatever raises, this request's reservation is
            # settled: a reservation left open holds a key's budget until the process restarts.
            # Accounting settles once, so after the relay has settled this does nothing.
            upstream_model = snapshot.upstream_model(request.model)
            changed = (
                clamped
                or salt is not None
                or request.adapter is not None
                or bool(upstream_model)
                or asked_priority
            )
            # A stream whose body asks nothing of stream_options gets include_usage appended to
            # the client's own bytes: serialising the whole body again would cost more.
            append_usage = (
                request.stream
                and not changed
                and request.bulk is None
                and "stream_options" not in body
            )
            if request.adapter is not None:
                # vLLM and SGLang serve a LoRA adapter under its own name (--lora-modules,
                # --lora-paths NAME=PATH); a llama.cpp replica gets its own variant of this
                # body, naming the adapter by index (UpstreamBodies, gateway/lora.py).
                body["model"] = request.adapter
            elif upstream_model:
                # An external endpoint that knows the model by another name (catalog:
                # upstream_model).
                body["model"] = upstream_model
            if request.stream:
                # Always ask for usage, so a streamed request is accounted like any other.
                options = body.get("stream_options") or {}
                body["stream_options"] = {**options, "include_usage": True}
            payload = UpstreamBodies(
                request,
                raw,
                with_member(raw, USAGE_OPTION)
                if append_usage
                else upstream_payload(request, raw, changed or request.stream),
                priority,
            )
            session = headers.get(SESSION_HEADER)
            prompt = salted_prompt(
                request.routing_prompt
                if request.routing_prompt is not None
                else prompt_bytes(body),
                salt,
            )
            # Hashed once for the router, which reads them to decide whether to ask for tokens
            # and on every choice, retries included.
            prompt_keys = state.router.prompt_keys(prompt)
            # For replicas that publish KV events: the prompt's tokens, from an engine.
            asked = await request_token_ids(
                state, request, snapshot.ready(request.model), prompt, prompt_keys
            )
            tokens = asked if isinstance(asked, PromptTokens) else None
            later = asked if isinstance(asked, TokensLater) else None
            routing_key = RequestKey(
                model=request.model,
                prompt=prompt,
                session=session.decode("latin-1") if session else request.user,
                token_ids=tokens.ids if tokens is not None else None,
                leading_only=tokens is not None and tokens.leading_only,
                prompt_tokens=tokens.length if tokens is not None else 0,
                cache_salt=cache_salt(body),
                adapter=request.adapter,
                tokens_later=later is not None,
                prompt_keys=prompt_keys,
            )
            relay = await first_answer(
                state,
                request,
                snapshot,
                routing_key,
                payload,
                deadline,
                watch,
                later,
                outcome.record,
            )
            return await relay.run(send, accounting, started)
        except BaseException:
            if watch.gone and routing_key is not None:
                accounting.settle(None)  # the engine may have had the prompt
            else:
                accounting.settle_failed()
            raise
        finally:
            if admission is not None:
                state.admission.leave(admission, accounting.used)
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


def _queue_cost(request: ProxiedRequest, prompt_estimate: int) -> float:
    """What the fair queue charges a request's key while it waits: its prompt and the
    completion it asks for, up to QUEUE_COMPLETION_GUESS a choice (the key is charged what it
    really used once it ends)."""
    if request.path == EMBEDDINGS:
        return prompt_estimate
    _, requested = completion_length(request.body)
    choices, _ = choices_requested(request.path, request.body)  # every completion it makes
    guess = QUEUE_COMPLETION_GUESS if requested is None else max(requested, 1)
    return prompt_estimate + min(guess, QUEUE_COMPLETION_GUESS) * choices


def _deadline_s(state: GatewayState, client_timeout: bytes | None) -> float:
    deadline = state.settings.request_deadline_s
    if client_timeout:
        with contextlib.suppress(ValueError):
            deadline = min(deadline, float(client_timeout))
    return deadline


async def _reserve(
    state: GatewayState, key: ApiKey, request: ProxiedRequest, prompt_estimate: int
) -> tuple[Reservation, bool]:
    """Reserve this request's worst case against the key's limits, shared with every gateway
    on the store (gateway/shared_limits.py), and clamp its max_tokens so the worst case really
    is the worst case (an engine stops at max_tokens, per choice). True when the body was
    changed.

    The worst case counts every completion the request makes: n or best_of per prompt, times
    the prompts of a /v1/completions array (llama.cpp runs each as a task of its own)."""
    body = request.body
    now = time.time()
    book = state.quota
    fields: list[str] = []
    prompts = 1
    attempt: Attempt
    if request.path == EMBEDDINGS:
        need = Need(prompt_estimate, prompt_estimate)

        def attempt(held: HeldLimits) -> Reservation | Denied:
            return book.reserve(key.key_id, held, prompt_estimate, now)

    else:
        # Every length field present bounds the completion and is clamped (llama.cpp reads its
        # own n_predict first): one left unclamped would run past the reservation.
        fields, requested = completion_length(body)
        choices, prompts = choices_requested(request.path, body)
        context = state.settings.assumed_context_tokens
        ceiling = context if requested is None else min(max(requested, 0), context)
        most = prompt_estimate + ceiling * choices
        # With a budget the completion is clamped to what is left (down to a token a choice);
        # without one, tpm reserves the whole worst case or nothing.
        least = prompt_estimate + choices if key.limits.token_budget is not None else most
        need = Need(least, most)

        def attempt(held: HeldLimits) -> Reservation | Denied:
            return book.reserve_completion(
                key.key_id,
                held,
                prompt_estimate,
                requested,
                now,
                context_tokens=context,
                choices=choices,
            )

    verdict = await state.limits.reserve(key.key_id, key.limits, need, attempt, now)
    if isinstance(verdict, Denied):
        state.metrics.quota_rejected(verdict.reason)
        raise _quota_error(verdict.reason, verdict.message, verdict.retry_after_s)
    clamped = False
    if request.path != EMBEDDINGS:
        verdict.prompts = prompts
        if verdict.max_tokens is not None:
            clamped = any(body.get(f) != verdict.max_tokens for f in fields)
            for f in fields:
                body[f] = verdict.max_tokens
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
