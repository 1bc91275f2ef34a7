"""What request handlers get injected: the app's shared state and the caller's key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import aiohttp
from fastapi import Depends, Request

from gateway.auth import KeyCache
from gateway.inflight import InFlight
from gateway.route_source import RouteRefresher
from gateway.settings import GatewaySettings
from gateway.store import ApiKey, Store
from gateway.upstream_keys import EngineKeys
from gateway.usage import UsageRecorder


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
    session: aiohttp.ClientSession


def get_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


State = Annotated[GatewayState, Depends(get_state)]


async def get_api_key(request: Request, state: State) -> ApiKey:
    return await state.keys.authenticate(request.headers.get("authorization"))


CallerKey = Annotated[ApiKey, Depends(get_api_key)]
