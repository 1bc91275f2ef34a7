"""Sending a request to a replica until one answers: the choice among the model's ready
replicas (those not tried, not failed, below their depth), the upstream hop, and a failure
before any byte moves the request to another replica while its deadline allows. Once a response
has started it is the answer, whatever it says (gateway/relay.py relays it)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING

import aiohttp

from gateway.deps import GatewayState
from gateway.errors import SERVER_ERROR, ApiError
from gateway.lora import UpstreamBodies, unserved
from gateway.relay import ClientWatch, Relay
from gateway.request_body import ProxiedRequest
from gateway.routing import Decision, RequestKey, Router, RoutingSnapshot, Sent
from gateway.routing.queue_bound import full_replicas
from gateway.routing.states import Expected, FeedState, classify, expected_cache
from gateway.tokenize import TokensLater
from gateway.upstream_post import closed_before_answering, post_upstream
from workflows.contracts import Route

if TYPE_CHECKING:
    from gateway.observe.record import RequestRecord
    from gateway.tracing import UpstreamAttempt

log = logging.getLogger(__name__)

RETRY_AFTER_S = "2"
# Statuses that mean "this replica cannot take it now", not "this request is wrong": another
# replica may well serve it.
RETRYABLE_STATUSES = frozenset({502, 503, 504})


async def first_answer(
    state: GatewayState,
    request: ProxiedRequest,
    snapshot: RoutingSnapshot,
    routing_key: RequestKey,
    payload: UpstreamBodies,
    deadline: float,
    watch: ClientWatch,
    later: TokensLater | None = None,
    record: RequestRecord | None = None,
) -> Relay:
    """Send to the chosen replica; while nothing has come back, a failure moves the request to
    another replica, as long as the deadline allows. Once a response has started, it is the
    answer, whatever it says. `later`: the prompt's token ids, being asked aside; the router
    gets them when they come (Router.tokens_arrived). `record`: the request log's, told each
    replica tried."""
    model = request.model
    tried: list[str] = []
    failure: str | None = None
    limit = state.settings.max_inflight_per_replica
    busy: set[str] = set()
    resent: set[str] = set()
    # The snapshot never changes: its ready list (a copy) is read once, not at each attempt.
    ready = snapshot.ready(model)
    # Replicas that do not load the requested LoRA adapter (llama.cpp): never chosen.
    excluded = unserved(ready, request.adapter)
    while True:
        # A replica holding its bound of this gateway's requests is passed over like one
        # already tried: the engine would only queue it. Nothing awaits between this count
        # and the acquire below, so concurrent requests cannot all take the last place.
        busy = _busy(state, ready, limit, tried)  # a new set: changed in place below
        if tried:
            busy.difference_update(tried)
        if excluded:
            busy -= excluded
        decision = state.router.choose(
            snapshot,
            routing_key,
            state.inflight.counts,
            # Nothing to pass over (the usual first attempt): no list is built.
            [*tried, *busy, *excluded] if tried or busy or excluded else (),
        )
        route = decision.route
        if route is None:
            break
        if tried:
            state.metrics.retry(model)
        state.metrics.routed(model, decision.reason)
        routed_state, expected = _routing_state(state, model, decision, route, routing_key)
        if record is not None:
            record.routed(route, decision.reason, routed_state)
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            failure = failure or "deadline"
            break
        state.inflight.acquire(route.replica_id)
        # Checked against the engine's usage when it reports cached tokens.
        predicted = decision.predicted_cached_tokens if routing_key.token_ids and route.kv else None
        sent = state.router.sent(
            route, routing_key, predicted or 0, decision, streamed=request.stream
        )
        if later is not None and sent is not None:
            later.ids.add_done_callback(
                functools.partial(_tokens_arrived, state.router, sent, route, routing_key)
            )
        attempt: UpstreamAttempt | None = None
        trace_headers: dict[str, str] | None = None
        if state.tracing is not None:
            trace_headers = {}
            attempt = state.tracing.attempt(
                route, decision.reason, routed_state, predicted, trace_headers
            )
        try:
            upstream = await post_upstream(
                state, route, request, payload.for_route(route), remaining, trace_headers
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            state.inflight.release(route.replica_id)
            state.router.finished(sent)
            if attempt is not None:
                attempt.answered(None, type(exc).__name__)
            if route.replica_id not in resent and closed_before_answering(exc):
                # Most likely a pooled connection the engine closed as idle just as the request
                # went out. Once per replica the request goes out again, on another connection,
                # before the replica counts as failed.
                resent.add(route.replica_id)
                log.info(
                    "replica %s closed a connection before answering; sending again",
                    route.replica_id,
                )
                state.metrics.upstream_error(model, "disconnected")
                continue
            reason = "timeout" if isinstance(exc, TimeoutError) else "unreachable"
            _failed(state, model, route, reason, exc)
            tried.append(route.replica_id)
            failure = reason
            continue
        except BaseException:
            state.inflight.release(route.replica_id)
            state.router.finished(sent)
            if attempt is not None:
                attempt.answered(None, "cancelled")
            raise
        if attempt is not None:
            failed = f"status_{upstream.status}" if upstream.status in RETRYABLE_STATUSES else ""
            attempt.answered(upstream.status, failed)
        if upstream.status in RETRYABLE_STATUSES:
            detail = f"answered {upstream.status}"
            upstream.release()
            state.inflight.release(route.replica_id)
            state.router.finished(sent)
            _failed(state, model, route, f"status_{upstream.status}", detail)
            tried.append(route.replica_id)
            failure = "unavailable"
            continue
        state.router.breaker.succeeded(route.replica_id, time.monotonic())
        return Relay(
            state,
            model,
            route,
            upstream,
            request.stream,
            request.wants_usage,
            watch,
            predicted,
            sent,
            expected,
        )

    if route is None and busy:
        # Every replica left to try is full: waiting helps, and no engine saw the request.
        raise ApiError(
            429,
            f"Every ready replica of the model '{model}' already holds {limit} requests from "
            "this gateway (max_inflight_per_replica); try again shortly.",
            type_=SERVER_ERROR,
            param="model",
            code="replicas_busy",
            headers={"Retry-After": RETRY_AFTER_S},
        )
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


def _routing_state(
    state: GatewayState, model: str, decision: Decision, route: Route, key: RequestKey
) -> tuple[str, Expected | None]:
    """Count how sure the decision was of the cache, log the model's routing changing state,
    and say which state it routed in and what its engine should report cached (None: nothing
    predicted)."""
    routed = classify(
        decision.reason,
        route,
        _feed_state(state, route),
        policy=state.router.policy,
        # The record other gateway processes share of what they sent where (gateway/peers/).
        picture_complete=state.peers is None or state.peers.picture.complete,
    )
    change = state.metrics.routing_state(model, routed)
    if change is not None:
        log.log(change.level, "%s", change.message())
    kv_tokens = decision.predicted_cached_tokens if key.token_ids and route.kv else 0
    # Blocks of the gateway's own record (prefix tree or slots), only where they chose.
    prefix_blocks = decision.matched_blocks if decision.reason == "prefix" else 0
    return routed.state, expected_cache(routed.state, kv_tokens, prefix_blocks)


def _feed_state(state: GatewayState, route: Route) -> FeedState | None:
    """What the gateway hears of the route's KV events now; None where it publishes none."""
    kv = route.kv
    if kv is None:
        return None
    if state.kv_feeds.watching(route) or state.kv_publishers.watching(route):
        return "live"
    if kv.feed:
        # Not live: connected to its agent's feed, short of a whole snapshot, or not connected.
        for reader in state.kv_feeds.readers():
            if reader.feed_url == kv.feed and reader.node == route.node and reader.connected:
                return "starting"
    return "down"


def _busy(state: GatewayState, ready: list[Route], limit: int, tried: list[str]) -> set[str]:
    """Replicas to pass over as full. Without the fair queue: those holding `limit` of this
    gateway's requests. With it: those at their depth, counting other gateways' requests by
    their engine's gauges, unless every replica not yet tried is (the queue let this request
    through on room it counted a moment ago, or a replica failed it: it goes to the least
    loaded rather than back with a 429)."""
    if not state.admission.enabled:
        return full_replicas(ready, state.inflight.counts, limit)
    full = state.admission.at_depth(ready, state.inflight.counts)
    if not full:
        return full
    untried = {r.replica_id for r in ready} - set(tried)
    return set() if untried <= full else full


def _failed(state: GatewayState, model: str, route: Route, reason: str, detail: object) -> None:
    log.warning("replica %s failed before answering (%s): %s", route.replica_id, reason, detail)
    state.metrics.upstream_error(model, reason)
    state.router.breaker.failed(route.replica_id, time.monotonic())


def _tokens_arrived(
    router: Router,
    sent: Sent,
    route: Route,
    routing_key: RequestKey,
    ids: asyncio.Future[tuple[int, ...] | None],
) -> None:
    token_ids = None if ids.cancelled() else ids.result()
    if token_ids is not None:
        router.tokens_arrived(sent, route, routing_key, token_ids)
