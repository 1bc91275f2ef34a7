"""LoRA adapters on the wire: how a request naming `<model>:<adapter>` reaches each engine.

vLLM and SGLang serve an adapter under its own name (--lora-modules, --lora-paths NAME=PATH):
the upstream body's `model` is the adapter's name. llama-server does not: it loads every
adapter unapplied (--lora ... --lora-init-without-apply) and applies one only to a request whose
`lora` field lists it by index, the order of its --lora flags, which is the profile's `lora`
order that the route publishes as `Route.adapters`. Adapters a request does not list run at
scale 0. But a request with no `lora` field at all runs with every adapter at its launch scale,
1.0 (llama.cpp b11434, server-context.cpp `launch_slot_with_task`; --lora-init-without-apply
only leaves the context unapplied until the first request): so a request for the base model
sent to a llama.cpp replica that loads adapters carries them all at scale 0. A client's own
`lora` field is refused (gateway/request_body.py): it would apply adapters the key's allowlist
does not grant.

So a llama.cpp replica can serve only the adapters its route lists, and each one's body differs
by index: `UpstreamBodies` builds each variant once, on first use. A vLLM replica's adapters can
change while it runs (the agent loads and unloads them, and the replica publishes its route
with the new list): a by-name replica whose route lists adapters is chosen only for those, so
an adapter just added goes to the replicas that loaded it already."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from gateway.body_parse import upstream_payload, with_member
from gateway.errors import ApiError
from gateway.request_body import ProxiedRequest
from workflows.contracts import Route, engine_facts

ADAPTER_SCALE = 1.0


def by_index(engine: str) -> bool:
    """Whether the engine selects an adapter per request by index, not by name: its row says
    (workflows/contracts/engine_facts.py, lora_by_index: llama.cpp)."""
    facts = engine_facts(engine)
    return facts is not None and facts.lora_by_index


def adapter_index(route: Route, adapter: str) -> int | None:
    """The adapter's index on a llama.cpp route (None: it does not load it). Not meaningful
    for engines that serve adapters by name."""
    try:
        return route.adapters.index(adapter)
    except ValueError:
        return None


def serves_adapter(route: Route, adapter: str) -> bool:
    """Whether the route can serve the adapter: a replica only those its route lists, except
    that a by-name engine's route listing none (a route from before routes listed adapters)
    is left to answer an unknown one itself (404)."""
    if adapter in route.adapters:
        return True
    return not by_index(route.engine) and not route.adapters


def unserved(routes: Iterable[Route], adapter: str | None) -> set[str]:
    """Replica ids that cannot serve the adapter: passed over like replicas already tried."""
    if adapter is None:
        return set()
    return {r.replica_id for r in routes if not serves_adapter(r, adapter)}


def ensure_adapter_served(model: str, adapter: str | None, ready: list[Route]) -> None:
    """404 when the model has ready replicas and none of them serves the adapter. With no
    ready replica, the usual 503 (or the wait for a cold start) applies instead."""
    if adapter is None or not ready or any(serves_adapter(r, adapter) for r in ready):
        return
    raise ApiError(
        404,
        f"The model '{model}' has no LoRA adapter '{adapter}'.",
        param="model",
        code="adapter_not_found",
    )


def lora_body(body: dict[str, Any], index: int) -> dict[str, Any]:
    """The body for llama-server: its `lora` field applies the one adapter at `index`."""
    return {**body, "lora": [{"id": index, "scale": ADAPTER_SCALE}]}


def base_body(body: dict[str, Any], loaded: int) -> dict[str, Any]:
    """The body for llama-server loading `loaded` adapters, asked for the base model: each one
    at scale 0 (without the field, llama-server would apply them all)."""
    return {**body, "lora": [{"id": i, "scale": 0.0} for i in range(loaded)]}


class UpstreamBodies:
    """The upstream payload per route. For engines serving adapters by name, and llama.cpp
    replicas loading none, it is the one payload built before routing; a llama.cpp replica
    loading adapters gets that body plus a `lora` field (the adapter's index, or every adapter
    at scale 0 for the base model), serialised once per variant."""

    def __init__(
        self, request: ProxiedRequest, raw: bytes, payload: bytes, priority: int | None = None
    ) -> None:
        """`priority`: the request's class, sent as `priority` to the replicas that take one
        (Route.takes_priority)."""
        self._request = request
        self._raw = raw
        self._payload = payload
        self._by_index: dict[int, bytes] = {}
        self._base: dict[int, bytes] = {}
        self._priority = priority
        self._with_priority: bytes | None = None

    def for_route(self, route: Route) -> bytes:
        if route.takes_priority and self._priority is not None:
            # Only vLLM takes one, and it gets the one payload every engine but llama.cpp gets.
            if self._with_priority is None:
                member = f'"priority":{self._priority}'.encode()
                self._with_priority = with_member(self._payload, member)
            return self._with_priority
        adapter = self._request.adapter
        if not by_index(route.engine):
            return self._payload
        if adapter is None:
            loaded = len(route.adapters)
            if not loaded:
                return self._payload
            if loaded not in self._base:
                body = base_body(self._request.body, loaded)
                request = replace(self._request, body=body)
                self._base[loaded] = upstream_payload(request, self._raw, changed=True)
            return self._base[loaded]
        index = adapter_index(route, adapter)
        if index is None:  # excluded by `unserved` before it could be chosen
            raise ValueError(f"replica {route.replica_id} does not load adapter {adapter!r}")
        if index not in self._by_index:
            # `model` stays as the client sent it, `<model>:<adapter>`: llama-server serves one
            # model and only echoes the name back in its answer.
            body = lora_body(self._request.body, index)
            body["model"] = f"{self._request.model}:{adapter}"
            request = replace(self._request, body=body)
            self._by_index[index] = upstream_payload(request, self._raw, changed=True)
        return self._by_index[index]
