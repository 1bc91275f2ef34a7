"""The keys' background round: the key table and external endpoints' keys, read from the store
so requests never wait on it. Also the routing table's round, which re-reads the endpoints' keys
whenever the table changes (see `routes_then_keys`).

Where each key's limits stand is not read here: every gateway on the store shares them through
leases (gateway/shared_limits.py), so a second gateway adds capacity, not a second set of limits.
"""

from __future__ import annotations

from gateway.deps import GatewayState


async def routes_then_keys(state: GatewayState) -> None:
    """One routing-table refresh; on a new table, the external endpoints' keys again.

    `llmgw model add` stores an endpoint's key before it applies the model, so any table that
    holds the model's routes was published after its key was stored: reading the keys after
    seeing that table finds it. Left to the keys' own round, a request could reach the new
    route up to a second before its key did, and go upstream without it."""
    before = state.routes.snapshot
    await state.routes.refresh()
    if state.routes.snapshot is not before:
        state.upstream_keys = await state.store.upstream_keys()


class KeyRefresh:
    def __init__(self, state: GatewayState) -> None:
        self._state = state

    async def run(self) -> None:
        state = self._state
        await state.keys.refresh()
        state.upstream_keys = await state.store.upstream_keys()
