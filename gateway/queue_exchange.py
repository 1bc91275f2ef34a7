"""The fair queue shared by the gateways on one store: every `quota_sync_interval_s` each gateway
writes what its queue holds (AdmissionGate.demand: per model, each key's weight and requests
waiting and admitted) and reads the others', and from both works out its share of each model's
slots and its keys' weight parts (gateway/admission/fleet_share.py). The gate reads them from
memory: no request ever waits on the store for them.

A gateway with nothing queued or running writes nothing (one empty report withdraws what it
last wrote). Reports older than STALE_ROUNDS rounds are neither read nor kept. When the store
cannot be reached the exchange stops sharing: every model's share is "all of it", as with one
gateway, until a round works again (the loop logs the outage once, and its end).
"""

from __future__ import annotations

import asyncio

from gateway.admission import AdmissionGate
from gateway.admission.fleet_share import FleetView, Report, fleet_view, fresh
from store import Store

# A report older than this many rounds is from a gateway that stopped (or lost the store).
STALE_ROUNDS = 3
# The longest a round may take before it counts as failed.
CALL_TIMEOUT_S = 5.0


class QueueExchange:
    def __init__(self, store: Store, gateway: str, interval_s: float) -> None:
        self._store = store
        self.gateway = gateway
        self.stale_s = STALE_ROUNDS * interval_s
        self._view = FleetView()
        self._published = False  # whether the store holds a non-empty report of this gateway's

    # -- what the gate calls, from memory

    def share(self, model: str) -> float | None:
        return self._view.share(model)

    def key_part(self, model: str, key_id: str) -> float:
        return self._view.key_part(model, key_id)

    # -- the round

    async def sync(self, gate: AdmissionGate) -> None:
        """Write this gateway's demand (when it has any, or to withdraw it), read the others',
        and hand the gate the room a changed share makes."""
        demand = gate.demand()
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                if demand or self._published:
                    await self._store.publish_queue_demand(self.gateway, demand, self.stale_s)
                    self._published = bool(demand)
                found = await self._store.queue_demands(self.stale_s)
        except Exception:
            self._set(gate, FleetView())
            raise
        others = fresh(
            (Report(r.gateway, r.age_s, r.demand) for r in found), self.gateway, self.stale_s
        )
        self._set(gate, fleet_view(demand, others))

    async def withdraw(self) -> None:
        """At shutdown: the others stop counting this gateway at once, not a few rounds later."""
        if self._published:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await self._store.publish_queue_demand(self.gateway, {}, self.stale_s)
            self._published = False

    def _set(self, gate: AdmissionGate, view: FleetView) -> None:
        changed = view != self._view
        self._view = view
        if changed:
            gate.kick()  # a larger share is room for what waits here
