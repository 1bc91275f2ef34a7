"""The keys' background round: the key table, external endpoints' keys, and where each token
budget stands, read from the store so requests never wait on it. Also the routing table's
round, which re-reads the endpoints' keys whenever the table changes (see `routes_then_keys`).

A budget's baseline (what the key spent earlier in its period, by any gateway before this one
started) is read once per key and period; from then on this gateway counts its own settlements.
Several gateways sharing a store each enforce the budget against their own count plus that
baseline, so together they can overshoot by what the others spent since; docs/gateway.md says so.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

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
        self._baselines: dict[str, date] = {}  # key_id -> the period its baseline is for

    async def run(self) -> None:
        state = self._state
        await state.keys.refresh()
        state.upstream_keys = await state.store.upstream_keys()
        today = datetime.now(UTC).date()
        for key in state.keys.known():
            if key.limits.token_budget is None:
                continue
            start = key.limits.budget_start(today)
            if self._baselines.get(key.key_id) == start:
                continue
            spent = await state.store.spent_tokens(key.key_id, start)
            state.quota.load_spent(key.key_id, start, spent)
            self._baselines[key.key_id] = start
