"""The gateway's view of the ledger's routing table: which replicas of a model can serve now.

A snapshot is built from the ledger's routing table each time it changes. Only READY routes are
candidates; the rest are kept so an unknown model (404) can be told from a known model whose
replicas are all starting, restarting or stopping (503). A ready route on a node the control
plane cannot hear (`node_unreachable`) is a last resort: used only while its model has no other
ready route, since its engine may well serve (only the agent may be down) and the gateway's own
retries and breakers judge it. Choosing among the candidates is `policy.Router`'s work (prefix
affinity, sessions, breakers, engine load).
"""

from __future__ import annotations

from workflows.contracts import ReplicaState, Route, RoutingTable


class RoutingSnapshot:
    def __init__(self, table: RoutingTable) -> None:
        self.table = table
        routable = ReplicaState.routable()
        self._all: dict[str, list[Route]] = {}
        self._ready: dict[str, list[Route]] = {}
        last_resort: dict[str, list[Route]] = {}
        # Sorted so every gateway walks replicas in the same order, whatever the ledger's order.
        for route in sorted(table.routes, key=lambda r: r.replica_id):
            self._all.setdefault(route.model, []).append(route)
            if route.state in routable:
                ready = last_resort if route.node_unreachable else self._ready
                ready.setdefault(route.model, []).append(route)
        for model, routes in last_resort.items():
            self._ready.setdefault(model, routes)
        self._idle = frozenset(table.idle_models)
        # External models known upstream by another name; all of a model's routes share it.
        self._upstream_names = {r.model: r.upstream_model for r in table.routes if r.upstream_model}

    @property
    def version(self) -> int:
        return self.table.version

    def models(self) -> list[str]:
        return sorted(set(self._all) | self._idle)

    def knows(self, model: str) -> bool:
        return model in self._all or model in self._idle

    def is_idle(self, model: str) -> bool:
        """Scaled to zero; a request wakes it."""
        return model in self._idle

    def ready(self, model: str) -> list[Route]:
        return list(self._ready.get(model, ()))

    def routes(self, model: str) -> list[Route]:
        return list(self._all.get(model, ()))

    def upstream_model(self, model: str) -> str | None:
        """The name to send `model`'s replicas instead of `model`, or None to send it as is."""
        return self._upstream_names.get(model)
