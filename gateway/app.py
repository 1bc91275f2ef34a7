"""The gateway application: `create_app` wires the routers, and its lifespan owns every client
and background loop, so nothing starts at import and tests build as many apps as they like."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import aiohttp
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import openai_routes
from gateway.admin import keys as admin_keys
from gateway.admin import models as admin_models
from gateway.admin import observe as admin_observe
from gateway.admin import playground as admin_playground
from gateway.admin import routes as admin_routes
from gateway.admin import usage as admin_usage
from gateway.admin.routes import require_local
from gateway.admission import AdmissionGate, QueuePolicy, ReplicaDepths
from gateway.admission.metrics import AdmissionCollector
from gateway.auth import AuthFailed, KeyCache
from gateway.body_parse import BodyParser
from gateway.cache_salt import CacheSalts
from gateway.console import remote as remote_console
from gateway.console import routes as console_routes
from gateway.console.source import ClusterCache, ClusterConsole
from gateway.deps import GatewayState, State
from gateway.engine_scrape import EngineScraper
from gateway.errors import install_error_handlers
from gateway.front_door import FrontDoor
from gateway.inflight import InFlight
from gateway.key_inflight import KeyInFlight
from gateway.key_refresh import KeyRefresh, routes_then_keys
from gateway.kv.feeds import KvFeeds
from gateway.kv.publishers import KvPublishers
from gateway.lockout import FailedAuthLimiter
from gateway.loops import PeriodicTask
from gateway.media_urls import MediaPolicy
from gateway.metrics import GatewayMetrics
from gateway.observe.request_log import RequestLog
from gateway.observe.series import BUCKET_S, SeriesBook
from gateway.peers import PeerBus
from gateway.peers.bus import advertised_host
from gateway.peers.metrics import PeerBusCollector
from gateway.queue_exchange import QueueExchange
from gateway.quota import QuotaBook
from gateway.route_source import RouteRefresher, RouteSource
from gateway.routing import Router
from gateway.routing.prefix_index import PrefixIndex
from gateway.settings import GatewaySettings
from gateway.shared_limits import SharedLimits
from gateway.store_health import StoreHealth
from gateway.upstream_http import UpstreamPool
from gateway.upstream_keys import EngineKeys
from gateway.usage import UsageRecorder
from kv.index import KvBlockIndex
from store import Store
from store.models import PRIORITY_CLASSES
from workflows import otel
from workflows.engine_keys import peer_bus_key, prefix_hash_key

if TYPE_CHECKING:
    from gateway.tracing import RequestTracing

log = logging.getLogger(__name__)


def _upstream_session(settings: GatewaySettings) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        # No total limit: a long stream is fine as long as bytes keep coming.
        timeout=aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.upstream_connect_timeout_s,
            sock_read=settings.upstream_read_timeout_s,
        ),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=settings.upstream_keepalive_s),
        # Never pick up HTTP(S)_PROXY from the environment: engine traffic goes straight to
        # the node, with its key.
        trust_env=False,
    )


async def _auth_failed(request: Request, exc: Exception) -> JSONResponse:
    """A refused key on a FastAPI route (/v1/models): counted by its reason, answered with the
    one 401 every refusal gets. (The proxied routes count theirs in gateway/proxy.py.)"""
    assert isinstance(exc, AuthFailed)
    state: GatewayState = request.app.state.gateway
    state.metrics.auth_failed(exc.reason)
    return exc.response()


def create_app(
    settings: GatewaySettings,
    store: Store,
    route_source: RouteSource,
    admin_address: tuple[str, int] | None = None,
    cluster: ClusterConsole | None = None,
) -> FrontDoor:
    """The store belongs to the caller (it opens and closes it); the app calls `init()` and reads
    the master secret at start-up. `admin_address`: the admin listener's socket address, when
    the admin API has a listener of its own (gateway/front_door.py). `cluster`: what the web
    console reads the cluster through and sends node and scale commands to."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await store.init()
        keys = KeyCache(store)
        routes = RouteRefresher(route_source)
        # One try before serving, so a healthy cluster has routes from the first request; a
        # failure here is not fatal, the loop keeps trying.
        await routes.refresh()
        usage = UsageRecorder(store)
        master_secret = await store.master_secret()
        engine_keys = EngineKeys(master_secret)
        session = _upstream_session(settings)
        upstream = UpstreamPool(
            settings.upstream_connect_timeout_s,
            settings.upstream_read_timeout_s,
            settings.upstream_keepalive_s,
        )
        kv_index = KvBlockIndex(settings.kv_index_max_blocks)
        # Readers start with the first routing table the engine-scrape loop hands it.
        kv_feeds = KvFeeds(kv_index, master_secret, session)
        kv_publishers = KvPublishers(kv_index)
        body_parser = BodyParser(
            settings.inline_parse_bytes,
            settings.body_parse_workers,
            settings.body_parse_wait_s,
            MediaPolicy.of(settings.media_url_allow),
        )
        quota = QuotaBook()
        lockout = FailedAuthLimiter(
            max_failures=settings.auth_failures_before_lockout,
            lockout_s=settings.auth_lockout_s,
        )
        health = StoreHealth(settings.store_outage_grace_s)
        limits = SharedLimits(store, quota, lockout, health, settings.quota_sync_interval_s)
        metrics = GatewayMetrics()
        tracing = _tracing(settings)
        # Prefix hashes keyed by the cluster's secret: every gateway process computes the same
        # ones, so the peer bus can share what each sent where (prefix_index.py).
        router = Router(
            policy=settings.routing_policy,
            kv_index=kv_index,
            index=PrefixIndex(hash_key=prefix_hash_key(master_secret)),
            ttft_target_s=settings.routing_ttft_target_s,
            prefill_tokens_per_s=settings.routing_prefill_tokens_per_s,
        )
        inflight = InFlight()
        peers = (
            PeerBus(
                store,
                router,
                lambda: inflight.counts,
                peer_bus_key(master_secret),
                advertised_host(settings.peer_host, settings.host),
            )
            if settings.peer_bus
            else None
        )
        exchange = QueueExchange(store, limits.holder, settings.quota_sync_interval_s)
        admission = AdmissionGate(
            QueuePolicy.of(settings),
            ReplicaDepths(settings.max_inflight_per_replica),
            lambda model: routes.snapshot.ready(model),
            router.loads.others,
            enabled=settings.fair_queue,
            refused=metrics.queue_refused,
            waited=lambda model, priority, s: metrics.queue_waited(
                model, PRIORITY_CLASSES[priority], s
            ),
            fleet_share=exchange.share,
            key_part=exchange.key_part,
        )
        # Closed however start-up ends: a store that fails here must not leave the session's
        # connector open (aiohttp warns about it at exit, and it holds sockets).
        try:
            state = GatewayState(
                settings=settings,
                store=store,
                keys=keys,
                routes=routes,
                inflight=inflight,
                usage=usage,
                engine_keys=engine_keys,
                cache_salts=CacheSalts(master_secret),
                session=session,
                upstream=upstream,
                metrics=metrics,
                quota=quota,
                limits=limits,
                lockout=lockout,
                router=router,
                key_inflight=KeyInFlight(),
                body_parser=body_parser,
                kv_index=kv_index,
                kv_feeds=kv_feeds,
                kv_publishers=kv_publishers,
                admission=admission,
                console=ClusterCache(cluster) if cluster is not None else None,
                peers=peers,
                tracing=tracing,
                request_log=RequestLog(settings.request_log_size)
                if settings.request_log_size
                else None,
            )
            state.metrics.watch_kv(kv_feeds, kv_publishers)
            state.metrics.watch_store(health)
            state.metrics.registry.register(AdmissionCollector(admission))
            if peers is not None:
                state.metrics.registry.register(PeerBusCollector(peers))
                # Before the first request: the other gateways' record, so this one does not
                # start cache-blind (bounded wait; gateway/peers/bus.py).
                await peers.start()
            key_refresh = KeyRefresh(state)
            await key_refresh.run()
            app.state.gateway = state
            loops = [
                PeriodicTask(
                    "routes-refresh", settings.refresh_interval_s, partial(routes_then_keys, state)
                ),
                PeriodicTask("keys-refresh", settings.key_refresh_interval_s, key_refresh.run),
                PeriodicTask("usage-flush", settings.usage_flush_interval_s, usage.flush),
                PeriodicTask("quota-sync", settings.quota_sync_interval_s, limits.sync),
                PeriodicTask(
                    "engine-scrape", settings.engine_scrape_interval_s, EngineScraper(state).run
                ),
            ]
            if state.request_log is not None:
                # The queue's depth for the charts: twice a bucket, each keeping the most seen.
                series = state.request_log.series
                loops.append(
                    PeriodicTask(
                        "queue-sample",
                        BUCKET_S / 2,
                        partial(_sample_queue, series, admission),
                    )
                )
            if settings.fair_queue and settings.queue_exchange:
                loops.append(
                    PeriodicTask(
                        "queue-exchange",
                        settings.quota_sync_interval_s,
                        partial(exchange.sync, admission),
                    )
                )
            for loop in loops:
                loop.start()
            try:
                yield
            finally:
                for loop in loops:
                    await loop.stop()
                await state.side_tasks.close()  # they use the session
                try:
                    await usage.flush()
                except Exception:
                    log.exception("usage could not be written at shutdown: %s", usage.pending())
                try:
                    # Spend reported and unused leases given back, for the other gateways.
                    await limits.sync(final=True)
                except Exception:
                    log.exception("the shared limits' last round failed at shutdown")
                try:
                    await exchange.withdraw()
                except Exception:
                    # The others stop counting it a few rounds later anyway.
                    log.exception("the fair queue's demand could not be withdrawn at shutdown")
        finally:
            try:
                if peers is not None:
                    await peers.close()
                await kv_publishers.close()
                await kv_feeds.close()  # its readers use the session
            finally:
                await session.close()
                await upstream.close()
                body_parser.close()
                await admission.close()
                if tracing is not None:
                    # What is batched goes out before the process ends; the exporter posts
                    # synchronously, so off the event loop.
                    await asyncio.to_thread(otel.shutdown)

    app = FastAPI(
        title="llmgw gateway",
        lifespan=lifespan,
        # No redirect from /path/ to /path: it would echo the request's Host back in Location
        # and tell any client which admin routes exist.
        redirect_slashes=False,
        # The OpenAI surface is documented by OpenAI; no schema pages to expose.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    install_error_handlers(app)
    app.add_exception_handler(AuthFailed, _auth_failed)
    app.include_router(openai_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(admin_models.router)
    app.include_router(admin_keys.router)
    app.include_router(admin_usage.router)
    app.include_router(admin_observe.router)
    app.include_router(admin_playground.router)
    app.include_router(console_routes.pages)
    app.include_router(console_routes.api)
    if settings.console_remote:
        # Off by default: without it no /console/ route exists on any listener.
        app.include_router(remote_console.pages)
        app.include_router(remote_console.api)

    # Served on the admin listener only (gateway/front_door.py): it names every model. Behind
    # the admin API's gate as well, so a browser page on that machine (DNS rebinding) cannot
    # read it either; Prometheus sends neither Origin nor Sec-Fetch-Site, and an IP as Host.
    @app.get("/metrics", dependencies=[Depends(require_local)])
    async def metrics(state: State) -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz(state: State) -> dict[str, Any]:
        # The gateway itself is up; how fresh its routes are is shown, not judged.
        return {
            "status": "ok",
            "routes_version": state.routes.snapshot.version,
            "routes_age_s": state.routes.age_s(),
            # Other gateway processes on the store, and whether each is heard now.
            "peers": state.peers.picture.peers() if state.peers is not None else {},
        }

    return FrontDoor(app, admin_address)


async def _sample_queue(series: SeriesBook, admission: AdmissionGate) -> None:
    series.sample_queue(admission.waiting())


def _tracing(settings: GatewaySettings) -> RequestTracing | None:
    """The request path's spans when an OTLP receiver is named; OpenTelemetry is imported only
    then (workflows/otel.py)."""
    if not otel.start("llmgw-gateway", settings.otlp_endpoint):
        return None
    from gateway.tracing import RequestTracing

    return RequestTracing()
