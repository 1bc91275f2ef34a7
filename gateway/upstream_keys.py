"""The key the gateway shows each engine, derived from the master secret (see
workflows/engine_keys.py) and cached per replica: derivation is two HMACs, but the hot path
should not repeat them."""

from __future__ import annotations

from workflows.contracts import Route
from workflows.engine_keys import engine_key_from_master


class EngineKeys:
    def __init__(self, master_secret: bytes) -> None:
        self._master = master_secret
        self._cache: dict[tuple[str, str], str] = {}

    def for_route(self, route: Route) -> str:
        ident = (route.node, route.replica_id)
        key = self._cache.get(ident)
        if key is None:
            key = engine_key_from_master(self._master, route.node, route.replica_id)
            self._cache[ident] = key
        return key
