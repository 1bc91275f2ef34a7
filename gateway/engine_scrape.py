"""The background loop that reads each ready replica's own /metrics for least-load routing.

Requests never wait on it: the router reads the last samples, and a sample too old to trust is
ignored rather than believed. A replica whose metrics do not answer counts as a failure for its
circuit breaker, so a dead engine is ejected even while no request is sent to it. External
endpoints are not scraped (their metrics, if any, are not ours to read).
"""

from __future__ import annotations

import logging
import time

import aiohttp

from engines.metrics import metrics_path
from gateway.deps import EXTERNAL_ENGINE, GatewayState
from gateway.routing import scrape_all
from gateway.routing.loads import EngineUnreachable, NoMetricsPage
from gateway.upstream_post import upstream_url
from workflows.contracts import Route

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 1.0
# What an engine without a metrics page answers for one.
NO_METRICS_PAGE = frozenset({404, 501})


class EngineScraper:
    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._version = -1
        self._failing: set[str] = set()

    async def _fetch(self, route: Route) -> str:
        state = self._state
        secret = state.upstream_auth(route)
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        try:
            async with state.session.get(
                upstream_url(route, metrics_path(route.engine)), headers=headers, timeout=timeout
            ) as r:
                if r.status in NO_METRICS_PAGE:
                    raise NoMetricsPage(f"HTTP {r.status}")
                r.raise_for_status()
                return await r.text()
        except aiohttp.ClientConnectionError as exc:  # refused, reset, closed: not answering
            raise EngineUnreachable(f"{type(exc).__name__}: {exc}") from exc

    async def run(self) -> None:
        state = self._state
        snapshot = state.routes.snapshot
        router = state.router
        if snapshot.version != self._version:
            # Replicas that left the table take their prefixes, breakers and samples along;
            # KV feeds follow the nodes of the replicas that publish KV events, and the
            # gateway's own subscriptions the external engines that do.
            router.retain(snapshot)
            state.kv_feeds.retain(snapshot)
            state.kv_publishers.retain(snapshot)
            self._version = snapshot.version
            # The fair queue reads the table itself (and hands out a new replica's room at its
            # next tick); only the depths it learnt of replicas that left go.
            ready = {r.replica_id for model in snapshot.models() for r in snapshot.ready(model)}
            state.admission.depths.retain(ready)
        routes = [
            route
            for model in snapshot.models()
            for route in snapshot.ready(model)
            if route.engine != EXTERNAL_ENGINE
        ]
        if not routes:
            return
        scraped = await scrape_all(routes, self._fetch, SCRAPE_TIMEOUT_S, own=state.inflight.counts)
        router.loads.update(scraped)
        for replica_id in scraped.ungauged:
            state.admission.depths.ungauged(replica_id)
        state.admission.observe(
            {replica: (s.running, s.waiting) for replica, s in scraped.items()},
            {route.replica_id: route.model for route in routes},
        )
        now = time.monotonic()
        for replica_id, why in scraped.failures.items():
            if replica_id not in self._failing:
                log.warning("no metrics from replica %s: %s", replica_id, why)
        for replica_id in scraped.unreachable:
            router.breaker.failed(replica_id, now)
        self._failing = set(scraped.failures)
