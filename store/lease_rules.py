"""Leases on a key's limits: the arithmetic every gateway and both store backends share. Pure.

A key's limit (rpm, tpm or token budget) is a pool in the store. A gateway leases a slice of it,
spends the slice in memory with no store round trip, and comes back (about once a second, all
its keys in one transaction) to report what it spent, give back what it does not need, and
renew its leases. The store never grants more than the limit leaves:

    spent + leased <= limit        (leased: every gateway's slices together)

so however many gateways share the store, together they admit no more than the limit. A slice
is the request's need plus a share of what is left (a quarter of it, never more than the
gateway's recent demand), so near the limit slices get small and no gateway sits on the last
of a budget while another is refused.

For rpm and tpm a unit a gateway used stays in its lease until it has left the gateway's
60-second window: only then is it given back or used again. So the units used in any 60
seconds, across every gateway, never pass the limit. For a budget, spent tokens move from the
lease to the pool's `spent` when reported.

A gateway that stops renewing (it died, or lost the store) has its leases reclaimed by the
store once they expire; spend it never reported is lost to the budget (its usage rows are
lost with it: they were in the same memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

LimitKind = Literal["rpm", "tpm", "budget"]
KINDS: Final[tuple[LimitKind, ...]] = ("rpm", "tpm", "budget")
# Of what is left past a request's own need, a slice takes at most this fraction.
SLICE_DIVISOR: Final = 4
# The window rpm and tpm count over (gateway/quota.py).
RATE_WINDOW_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class PoolRef:
    """One limit of one key. `period`: the budget period's first UTC day (ISO), '' for rates."""

    key_id: str
    kind: LimitKind
    period: str = ""
    # Hashed once: a gateway looks a key's pools up in its holdings and demand several times a
    # request, and a frozen dataclass's own __hash__ builds and hashes a tuple of the fields
    # each time.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.key_id, self.kind, self.period)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[PoolRef], tuple[str, LimitKind, str]]:
        # Pickled by its fields: str hashes differ between processes, so the hash is made anew.
        return PoolRef, (self.key_id, self.kind, self.period)


@dataclass(frozen=True, slots=True)
class LeaseChange:
    """What one gateway asks of one pool in a sync: report `spent` (budget), give back
    `give_back` unused units, and take at least `need` (or nothing), `want` if the pool has it,
    plus up to `slack` as a slice of what is left."""

    pool: PoolRef
    spent: int = 0
    give_back: int = 0
    need: int = 0
    want: int = 0
    slack: int = 0


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A pool after a change, as the gateway that asked sees it."""

    pool: PoolRef
    held: int  # what this gateway's lease holds now
    granted: int  # what this change granted
    refused: bool  # a need the pool could not meet
    limit: int | None  # the key's limit as the store has it (None: no such limit any more)
    spent: int  # the pool's spend (budget)
    leased: int  # every gateway's leases together, this one's included


@dataclass(slots=True)
class PoolRow:
    spent: int = 0
    leased: int = 0


def grant_size(available: int, need: int, want: int, slack: int) -> int:
    """What a pool with `available` units left grants: nothing when the need does not fit;
    else `want` (at least the need) as far as it fits, plus a slice of the rest."""
    if need <= 0 and want <= 0 and slack <= 0:
        return 0
    if available < need:
        return 0
    base = min(max(want, need, 0), available)
    extra = min(max(slack, 0), (available - base) // SLICE_DIVISOR)
    return base + extra


def apply_change(
    pool: PoolRow, held: int, limit: int | None, change: LeaseChange
) -> tuple[int, LeaseState]:
    """Applies `change` to `pool` (in place) and to a lease holding `held`; returns the lease's
    new holding and what the gateway is told. The caller holds the pool's lock.

    Spent tokens come out of the lease first; any beyond it (an engine that ran past its
    max_tokens) are spent all the same: spend is what was used. A pool without a limit (the
    key's limit was lifted) grants what is wanted: the gateway stops leasing once it sees that.
    """
    spent = max(change.spent, 0)
    pool.spent += spent
    converted = min(spent, held)
    held -= converted
    pool.leased -= converted
    returned = min(max(change.give_back, 0), held)
    held -= returned
    pool.leased -= returned
    if limit is None:
        granted = max(change.want, change.need, 0)
        refused = False
    else:
        available = max(limit - pool.spent - pool.leased, 0)
        granted = grant_size(available, change.need, change.want, change.slack)
        refused = change.need > 0 and granted == 0
    held += granted
    pool.leased += granted
    return held, LeaseState(
        pool=change.pool,
        held=held,
        granted=granted,
        refused=refused,
        limit=limit,
        spent=pool.spent,
        leased=pool.leased,
    )


def spare(held: int, in_use: int, keep: int) -> int:
    """Units a gateway can give back: what its lease holds beyond what is in use (in flight,
    or still in the 60-second window) and what it expects to use before its next sync."""
    return max(held - max(in_use, 0) - max(keep, 0), 0)


def shortfall(held: int, in_use: int, amount: int) -> int:
    """Units the lease lacks for `amount` more: 0 when it already covers them."""
    return max(max(in_use, 0) + amount - held, 0)


def lease_ttl_s(outage_grace_s: float, sync_interval_s: float) -> float:
    """How long the store keeps a lease that is not renewed. Longer than the outage grace
    (a gateway cut off from the store spends its leases for that long, then refuses), and
    than a rate window (the units a dead gateway used in its last minute still count), with a
    margin for the round trip and a few missed syncs, so nobody else is granted units that a
    cut-off gateway may still spend."""
    return max(outage_grace_s, RATE_WINDOW_S) + max(10.0, 5 * sync_interval_s)
