"""What request handlers get injected: the app's shared state and the caller's key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

import aiohttp
from fastapi import Depends, Request

from gateway.admission import AdmissionGate
from gateway.auth import KeyCache
from gateway.body_parse import BodyParser
from gateway.cache_salt import CacheSalts
from gateway.console.sessions import SessionBook
from gateway.console.source import ClusterCache
from gateway.inflight import InFlight
from gateway.key_inflight import KeyInFlight
from gateway.kv.feeds import KvFeeds
from gateway.kv.publishers import KvPublishers
from gateway.lockout import FailedAuthLimiter
from gateway.metrics import GatewayMetrics
from gateway.observe.request_log import RequestLog
from gateway.peers import PeerBus
from gateway.prefix_tokens import PrefixTokens
from gateway.quota import QuotaBook
from gateway.route_source import RouteRefresher
from gateway.routing import Router
from gateway.settings import GatewaySettings
from gateway.shared_limits import SharedLimits
from gateway.side_tasks import SideTasks
from gateway.upstream_http import UpstreamPool
from gateway.upstream_keys import EngineKeys
from gateway.usage import UsageRecorder
from kv.index import KvBlockIndex
from store import ApiKey, Store
from workflows.contracts import Route

if TYPE_CHECKING:
    # Imported only where the gateway traces (gateway/app.py): OpenTelemetry stays out of
    # a gateway that does not.
    from gateway.tracing import RequestTracing

EXTERNAL_ENGINE = "external"


@dataclass
class GatewayState:
    """Everything the lifespan builds and the handlers share; one per app, no globals."""

    settings: GatewaySettings
    store: Store
    keys: KeyCache
    routes: RouteRefresher
    inflight: InFlight
    usage: UsageRecorder
    engine_keys: EngineKeys
    # Each key's prefix-cache salt, for keys with isolate_cache (gateway/cache_salt.py).
    cache_salts: CacheSalts
    session: aiohttp.ClientSession
    # The proxied requests' connections to engines on plain http (gateway/upstream_http.py).
    upstream: UpstreamPool
    metrics: GatewayMetrics
    quota: QuotaBook
    # The keys' limits as every gateway on the store shares them (leases on `quota`'s limits).
    limits: SharedLimits
    lockout: FailedAuthLimiter
    router: Router
    # Estimated prompt tokens each key has in flight (settings.max_inflight_prompt_tokens).
    key_inflight: KeyInFlight
    # Parses request bodies, large ones in worker processes off the event loop.
    body_parser: BodyParser
    # What the engines that publish KV events hold (the router reads it), and what fills it:
    # the readers of the node agents' feeds (gateway/kv/feeds.py) and the subscriptions to
    # external engines' publishers (gateway/kv/publishers.py).
    kv_index: KvBlockIndex
    kv_feeds: KvFeeds
    kv_publishers: KvPublishers
    # Which requests go to the engines now, and in what order the others wait (fair queue).
    admission: AdmissionGate
    # Chats' leading messages as token ids, learned from engines (gateway/prefix_tokens.py).
    prefix_tokens: PrefixTokens = field(default_factory=PrefixTokens)
    # What requests start and do not wait for: learning those leading messages.
    side_tasks: SideTasks = field(default_factory=SideTasks)
    # model -> the key its external endpoints want (refreshed from the store); gateway-only.
    upstream_keys: dict[str, str] = field(default_factory=dict)
    # The web console's view of the cluster (gateway/console/); None when the process running
    # the gateway gave it none (the console then shows the gateway's own figures only).
    console: ClusterCache | None = None
    # The remote console's logins (gateway/console/remote.py), in this process's memory only.
    console_sessions: SessionBook = field(default_factory=SessionBook)
    # The other gateway processes on the store and what they told this one (gateway/peers/);
    # None when settings.peer_bus is off.
    peers: PeerBus | None = None
    # The request path's spans (gateway/tracing.py); None when the gateway does not trace.
    tracing: RequestTracing | None = None
    # The last requests and their charts (gateway/observe/); None when settings.request_log_size
    # is 0, and then a request records nothing.
    request_log: RequestLog | None = None

    def upstream_auth(self, route: Route) -> str | None:
        """The bearer the gateway shows this replica: an external endpoint's own key (or none),
        or the engine key llmgw derived for a replica it runs."""
        if route.engine == EXTERNAL_ENGINE:
            return self.upstream_keys.get(route.model)
        return self.engine_keys.for_route(route)


def get_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


State = Annotated[GatewayState, Depends(get_state)]


async def get_api_key(request: Request, state: State) -> ApiKey:
    return await state.keys.authenticate(request.headers.get("authorization"))


CallerKey = Annotated[ApiKey, Depends(get_api_key)]
