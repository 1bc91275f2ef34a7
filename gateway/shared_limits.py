"""Keys' limits shared by every gateway on one store, through leases (store/lease_rules.py).

The quota book (gateway/quota.py) still decides each request in memory, synchronously, but
against what this gateway holds of each limit, not the limit itself. A request the holdings do
not cover waits for one store round trip that leases more (one at a time per gateway, so fifty
requests arriving together cost one trip or a few); the background round (`sync`, about twice a
second) reports budget spend, gives back what this gateway does not need and renews its leases,
all keys in one transaction.

Anything owed to the store (spend to report, units to give back) stays owed until a round
trip that carries it succeeds, so a store outage loses none of it. While the store is away the
gateway spends what it holds; past `store_outage_grace_s` it refuses every request (503), since
it can no longer tell a revoked key or another gateway's spend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.errors import ApiError
from gateway.lockout import FailedAuthLimiter
from gateway.quota import IN_FLIGHT_RETRY_S, Denied, QuotaBook, Reservation
from gateway.store_health import StoreHealth
from store import KeyLimits, Store
from store.lease_rules import (
    KINDS,
    LeaseChange,
    LeaseState,
    LimitKind,
    PoolRef,
    lease_ttl_s,
    shortfall,
    spare,
)

log = logging.getLogger(__name__)

# The longest a lease round trip may take before the store counts as unreachable.
STORE_CALL_TIMEOUT_S = 5.0
# Units a gateway used come back as they leave its 60-second window, and another gateway's
# spare units at its next round: a second is a fair first retry either way.
RATE_RETRY_S = 1.0

Attempt = Callable[["HeldLimits"], Reservation | Denied]


@dataclass(frozen=True, slots=True)
class HeldLimits:
    """A key's limits as far as this gateway may spend them: what its leases hold."""

    rpm: int | None
    tpm: int | None
    token_budget: int | None
    budget_period: str


@dataclass(frozen=True, slots=True)
class Need:
    """Tokens a request counts against tpm and budget: at least `least` (it is refused below
    that), `most` if it can have them (a completion clamped to less otherwise)."""

    least: int
    most: int


# A key with no rpm, tpm or budget holds nothing: one HeldLimits per budget period, not one per
# request (building a frozen dataclass costs about 0.35 us).
_UNLIMITED = {period: HeldLimits(None, None, None, period) for period in ("day", "month")}


def holder_name() -> str:
    """This gateway process, as its leases name it: unique even across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _limit_of(limits: KeyLimits, kind: LimitKind) -> int | None:
    if kind == "rpm":
        return limits.rpm
    if kind == "tpm":
        return limits.tpm
    return limits.token_budget


def _pool(key_id: str, limits: KeyLimits, kind: LimitKind, now: float) -> PoolRef:
    if kind != "budget":
        return PoolRef(key_id, kind)
    today = datetime.fromtimestamp(now, UTC).date()
    return PoolRef(key_id, kind, limits.budget_start(today).isoformat())


class SharedLimits:
    def __init__(
        self,
        store: Store,
        book: QuotaBook,
        lockout: FailedAuthLimiter,
        health: StoreHealth,
        sync_interval_s: float,
        holder: str | None = None,
    ) -> None:
        self._store = store
        self._book = book
        self._lockout = lockout
        self.health = health
        self.holder = holder or holder_name()
        self.ttl_s = lease_ttl_s(health.grace_s, sync_interval_s)
        self._held: dict[PoolRef, int] = {}
        self._owed_spent: dict[PoolRef, int] = {}
        self._owed_return: dict[PoolRef, int] = {}
        self._demand: dict[PoolRef, int] = {}  # units asked for since the last round
        self._last_demand: dict[PoolRef, int] = {}  # ... and in the round before
        self._limits: dict[str, KeyLimits] = {}  # keys with leases: their limits as last seen
        # key id -> (its limits, the UTC day, its pools): see _pools_of.
        self._pool_cache: dict[str, tuple[KeyLimits, int, dict[LimitKind, PoolRef]]] = {}
        # Pools the store refused a need since the last round, as it answered then.
        self._refusals: dict[PoolRef, LeaseState] = {}
        self._lockouts_to_send: list[tuple[str, float]] = []
        # One store call at a time: a lease's holding is whatever the last call said.
        self._lock = asyncio.Lock()

    def held(self, pool: PoolRef) -> int:
        return self._held.get(pool, 0)

    # --- the request path -------------------------------------------------------------------

    async def reserve(
        self, key_id: str, limits: KeyLimits, need: Need, attempt: Attempt, now: float
    ) -> Reservation | Denied:
        """Admit a request against the key's shared limits. `attempt` runs the quota book with
        the limits it is given (this gateway's holdings); it is called with the store's
        answer in hand, so a denial names the key's real limits."""
        pools = self._pools_of(key_id, limits, now)
        if not pools:
            unlimited = _UNLIMITED.get(limits.budget_period)
            if unlimited is None:
                unlimited = HeldLimits(None, None, None, limits.budget_period)
            return attempt(unlimited)
        self._limits[key_id] = limits
        demand = self._demand
        for pool in pools.values():
            amount = 1 if pool.kind == "rpm" else need.most
            demand[pool] = demand.get(pool, 0) + amount
        verdict: Reservation | Denied | None = None
        for _ in range(2):  # a second round when requests in between took the new lease
            changes = self._top_ups(pools, need, now)
            if changes:
                known = self._known_refusal(changes)
                if known is not None:
                    return self._denied(known, limits, need, now)
                async with self._lock:
                    changes = self._top_ups(pools, need, now)
                    known = self._known_refusal(changes)
                    if known is not None:
                        return self._denied(known, limits, need, now)
                    if changes:
                        refused = await self._call(changes)
                        if refused is not None:
                            return self._denied(refused, limits, need, now)
            verdict = attempt(self._held_limits(limits, pools))
            if isinstance(verdict, Reservation):
                return verdict
        assert isinstance(verdict, Denied)
        return self._reworded(verdict, limits, need)

    def _pools_of(self, key_id: str, limits: KeyLimits, now: float) -> dict[LimitKind, PoolRef]:
        """The key's pools, by kind: the same objects while its limits (the same KeyLimits,
        until the key cache reloads it) and the UTC day stay the same. Building them was 2.5% of
        the gateway's CPU per request (a frozen dataclass each, a date for the budget's)."""
        day = int(now // 86_400)  # POSIX time has no leap seconds: this is the UTC date
        cached = self._pool_cache.get(key_id)
        if cached is not None and cached[0] is limits and cached[1] == day:
            return cached[2]
        previous = cached[2] if cached is not None else {}
        pools = {}
        for kind in KINDS:
            if _limit_of(limits, kind) is None:
                continue
            pool = _pool(key_id, limits, kind, now)
            # The very object as before where the pool is the same: a dict keeps the first
            # object it was given as a key, and a lookup by another, equal one compares the two
            # field by field (several times a request, after every reload of the key's limits).
            same = previous.get(kind)
            pools[kind] = same if same == pool and same is not None else pool
        self._pool_cache[key_id] = (limits, day, pools)
        return pools

    def _known_refusal(self, changes: list[LeaseChange]) -> LeaseState | None:
        """A pool the store refused since the last round, for a need no smaller than this
        one's: refused again without asking. Fifty requests past a budget cost one round trip,
        not fifty in a row (during which the admitted ones could settle and skew the count)."""
        for change in changes:
            known = self._refusals.get(change.pool)
            if known is not None and change.need > _available(known):
                return known
        return None

    def _held_limits(self, limits: KeyLimits, pools: dict[LimitKind, PoolRef]) -> HeldLimits:
        held = self._held
        rpm, tpm, budget = pools.get("rpm"), pools.get("tpm"), pools.get("budget")
        return HeldLimits(
            None if rpm is None else held.get(rpm, 0),
            None if tpm is None else held.get(tpm, 0),
            None if budget is None else held.get(budget, 0),
            limits.budget_period,
        )

    def _top_ups(
        self, pools: dict[LimitKind, PoolRef], need: Need, now: float
    ) -> list[LeaseChange]:
        changes = []
        holdings, in_use_of = self._held, self._book.in_use
        for kind, pool in pools.items():
            held = holdings.get(pool, 0)
            in_use = in_use_of(pool.key_id, kind, now)
            least, most = (1, 1) if kind == "rpm" else (need.least, need.most)
            if max(in_use, 0) + most <= held:
                continue  # shortfall(held, in_use, most) is 0, without the call per pool
            changes.append(
                LeaseChange(
                    pool,
                    spent=self._owed_spent.get(pool, 0),
                    give_back=self._owed_return.get(pool, 0),
                    need=shortfall(held, in_use, least),
                    want=shortfall(held, in_use, most),
                    slack=self._expected(pool),
                )
            )
        return changes

    def check_store(self, now: float) -> None:
        """Refuse every request once the store has been gone past the grace."""
        down = self.health.down_for(now)
        if down > self.health.grace_s:
            self.health.refused()
            raise ApiError(
                503,
                f"The gateway has not reached its store for {down:.0f} s, so it cannot check "
                "keys or limits; try again later.",
                code="store_unreachable",
                headers={"Retry-After": "5"},
            )

    # --- the background round ---------------------------------------------------------------

    async def sync(self, final: bool = False) -> None:
        """Report spend, give back spare units, renew leases; share lockouts both ways.
        `final` (shutdown) gives back everything not in use. Units still in a rate window
        stay leased until the lease expires, so a restart does not double a minute's rate."""
        now = time.time()
        async with self._lock:
            if final:
                self._demand.clear()
                self._last_demand.clear()
            changes = [self._settling(pool, now) for pool in self._pools()]
            self._last_demand, self._demand = self._demand, {}
            # Other gateways gave back what they do not use at their rounds: ask again.
            self._refusals.clear()
            await self._call([c for c in changes if c is not None], background=True)
        await self._share_lockouts()

    def _expected(self, pool: PoolRef) -> int:
        """Units this gateway expects to use on the pool before its next round: twice what
        it asked for in the last round or this one, whichever is more. Leasing that much at a
        time keeps a steady key off the store between rounds."""
        return 2 * max(self._demand.get(pool, 0), self._last_demand.get(pool, 0))

    def _pools(self) -> list[PoolRef]:
        return sorted(
            set(self._held) | set(self._owed_spent) | set(self._owed_return),
            key=lambda p: (p.key_id, p.kind, p.period),
        )

    def _settling(self, pool: PoolRef, now: float) -> LeaseChange | None:
        held = self._held.get(pool, 0)
        limits = self._limits.get(pool.key_id)
        current = limits is not None and _limit_of(limits, pool.kind) is not None
        if current and limits is not None and _pool(pool.key_id, limits, pool.kind, now) != pool:
            current = False  # a budget period that has ended
        if pool.kind == "budget" and current:
            spent = self._book.take_spent(pool.key_id)
            if spent:
                self._owed_spent[pool] = self._owed_spent.get(pool, 0) + spent
                held -= spent
        in_use = self._book.in_use(pool.key_id, pool.kind, now) if current else 0
        keep = self._expected(pool) if current else 0
        back = spare(held, in_use, keep)
        if back:
            self._owed_return[pool] = self._owed_return.get(pool, 0) + back
            held -= back
        spent_owed, return_owed = self._owed_spent.get(pool, 0), self._owed_return.get(pool, 0)
        if held or current:
            self._held[pool] = held
        else:
            self._held.pop(pool, None)  # a pool this gateway is done with
        if not spent_owed and not return_owed:
            return None
        return LeaseChange(pool, spent=spent_owed, give_back=return_owed)

    async def _call(
        self, changes: list[LeaseChange], background: bool = False
    ) -> LeaseState | None:
        """One round trip; returns the first pool that refused a need, if any."""
        now = time.time()
        try:
            # Bounded: a store that hangs (a partition without resets) counts as lost.
            states = await asyncio.wait_for(
                self._store.sync_leases(self.holder, self.ttl_s, changes), STORE_CALL_TIMEOUT_S
            )
        except Exception as exc:
            self.health.failed(now)
            if background:
                raise
            self.health.refused()
            raise ApiError(
                503,
                "The gateway cannot reach its store to check this key's limits; try again shortly.",
                code="store_unreachable",
                headers={"Retry-After": "2"},
            ) from exc
        self.health.succeeded(time.time())
        refused = None
        for change, state in zip(changes, states, strict=True):
            pool = change.pool
            self._owed_spent.pop(pool, None)
            self._owed_return.pop(pool, None)
            if state.held:
                self._held[pool] = state.held
            else:
                self._held.pop(pool, None)
            if state.refused:
                self._refusals[pool] = state
                refused = refused or state
            else:
                self._refusals.pop(pool, None)
        return refused

    async def _share_lockouts(self) -> None:
        sending, self._lockouts_to_send = self._lockouts_to_send, []
        try:
            async with asyncio.timeout(STORE_CALL_TIMEOUT_S):
                for client, seconds in sending:
                    await self._store.lock_out(client, seconds)
                active = await self._store.lockouts()
        except Exception:
            self._lockouts_to_send = sending + self._lockouts_to_send
            raise
        now = time.monotonic()
        for client, seconds in active.items():
            self._lockout.lock(client, seconds, now)

    def locked_out(self, client: str, seconds: float) -> None:
        """A lockout this gateway started: the other gateways hear of it in the next round."""
        self._lockouts_to_send.append((client, seconds))

    # --- what a refused client is told ------------------------------------------------------

    def _denied(self, state: LeaseState, limits: KeyLimits, need: Need, now: float) -> Denied:
        pool = state.pool
        limit = state.limit or 0
        if pool.kind == "rpm":
            if limit <= 0:
                return Denied("rpm", "This key may not make requests (its rpm limit is 0).", None)
            return Denied(
                "rpm",
                f"This key is limited to {limit} requests per minute.",
                RATE_RETRY_S,
            )
        if pool.kind == "tpm":
            message = (
                f"This key is limited to {limit} tokens per minute and this request may use "
                f"up to {need.least}."
            )
            if need.least > limit:
                hint = " Send a shorter prompt or a lower max_tokens."
                return Denied("tpm", message + hint, None)
            return Denied("tpm", message, RATE_RETRY_S)
        in_flight = max(state.leased, 0)
        message = (
            f"This key has spent {state.spent} of its budget of {limit} tokens per "
            f"{limits.budget_period} (UTC), {in_flight} more are held by requests in flight "
            "(leased by the gateways), "
            f"and this request may use up to {need.least}."
        )
        if need.least > limit:
            return Denied("budget", message, None)
        if state.spent + need.least <= limit:
            return Denied("budget", message, IN_FLIGHT_RETRY_S)
        return Denied("budget", message, _period_end(pool.period, limits.budget_period) - now)

    def _reworded(self, denied: Denied, limits: KeyLimits, need: Need) -> Denied:
        """A denial from the book speaks of this gateway's holdings; say the key's limit."""
        limit = _limit_of(limits, denied.reason)
        what = {"rpm": "requests per minute", "tpm": "tokens per minute"}.get(
            denied.reason, f"tokens per {limits.budget_period} (UTC)"
        )
        return Denied(
            denied.reason,
            f"This key is limited to {limit} {what}, shared by every gateway, and requests "
            f"in flight hold the rest; this request may use up to {need.least}.",
            denied.retry_after_s if denied.retry_after_s is not None else IN_FLIGHT_RETRY_S,
        )


def _available(state: LeaseState) -> int:
    """What the pool could still grant when the store answered."""
    if state.limit is None:
        return 1 << 62
    return max(state.limit - state.spent - state.leased, 0)


def _period_end(period_start: str, period: str) -> float:
    start = datetime.fromisoformat(period_start).replace(tzinfo=UTC)
    if period == "month":
        end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    else:
        end = datetime.fromtimestamp(start.timestamp() + 86_400, UTC)
    return end.timestamp()
