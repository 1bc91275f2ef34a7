"""The store interface both backends implement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import date, datetime

from store.lease_rules import LeaseChange, LeaseState
from store.models import ApiKey, KeyLimits, StoreDump, UsageDelta, UsageRow
from store.queue_demand import Demand, DemandReport

# A fresh key_id colliding with an existing one is a 1-in-4-billion event; retrying a few times
# turns it into "never" without a second column.
KEY_ID_ATTEMPTS = 5


class KeyNameTaken(ValueError):
    """An unrevoked key already has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"an API key named {name!r} already exists and is not revoked; "
            "revoke it first or choose another name"
        )
        self.name = name


class Store(ABC):
    """Every method that takes text checks it first: a value the store cannot keep exactly is a
    ValueError naming the field, never a database error."""

    @abstractmethod
    async def init(self) -> None:
        """Create the tables if they are missing and add the columns an older schema lacks.
        Safe to call on every start."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def master_secret(self) -> bytes:
        """The engine-key master secret, created on first use. Every caller, in any process,
        gets the same value: the first writer wins and everyone reads what it wrote."""

    @abstractmethod
    async def create_key(
        self,
        name: str,
        models: list[str] | None = None,
        expires_at: datetime | None = None,
        adapters: list[str] | None = None,
        limits: KeyLimits | None = None,
        admin: bool = False,
    ) -> tuple[ApiKey, str]:
        """Create a key; returns its record and the plaintext key, which is not kept."""

    @abstractmethod
    async def get_key(self, key_id: str) -> ApiKey | None: ...

    @abstractmethod
    async def list_keys(self) -> list[ApiKey]:
        """Every key, revoked ones included, oldest first."""

    @abstractmethod
    async def revoke_key(self, name_or_id: str) -> bool:
        """Revoke the unrevoked key with this key_id, or else this name. False if none."""

    @abstractmethod
    async def set_key_limits(self, name_or_id: str, limits: KeyLimits) -> ApiKey | None:
        """Replace the limits of the unrevoked key with this key_id, or else this name; returns
        the updated record, None if there is no such key."""

    @abstractmethod
    async def add_usage(self, rows: list[UsageDelta]) -> None:
        """Add each delta to its (key_id, model, day) totals, all in one transaction."""

    @abstractmethod
    async def usage(
        self,
        key_id: str | None = None,
        model: str | None = None,
        since: date | None = None,
        until: date | None = None,
    ) -> list[UsageRow]:
        """Totals per (key_id, model, day) with since <= day <= until, filtered, ordered by day
        then key then model."""

    @abstractmethod
    async def spent_tokens(self, key_id: str, since: date) -> int:
        """Prompt plus completion tokens of this key on every model since that UTC day
        (inclusive): what a token budget starts from when a gateway starts."""

    @abstractmethod
    async def set_upstream_key(self, model: str, key: str | None) -> None:
        """Keep the API key the gateway sends to an external model's endpoint; None deletes
        it."""

    @abstractmethod
    async def upstream_keys(self) -> dict[str, str]:
        """Every upstream key, by model name."""

    @abstractmethod
    async def export_dump(self) -> StoreDump:
        """Everything in the store, read in one consistent snapshot."""

    @abstractmethod
    async def import_dump(self, dump: StoreDump, replace_secrets: bool = True) -> None:
        """Write a dump in one transaction: keys and usage rows replace those with the same
        identity (so importing twice changes nothing), secrets replace existing ones unless
        replace_secrets is False. A key whose name an other unrevoked key holds raises
        KeyNameTaken and nothing is written."""

    @abstractmethod
    async def sync_leases(
        self, holder: str, ttl_s: float, changes: Sequence[LeaseChange]
    ) -> list[LeaseState]:
        """One gateway's round with the shared limits (store/lease_rules.py), in one
        transaction: each change applied to its pool under the pool's lock (expired leases of
        that pool reclaimed first), then every lease `holder` has renewed for `ttl_s`. The
        key's limit is read from the key's row, so a changed or revoked key counts at once.
        States come back in the order of `changes`."""

    @abstractmethod
    async def lock_out(self, client: str, seconds: float) -> None:
        """Record that `client` (an address group, gateway/lockout.py) is locked out for
        `seconds` from now, by the store's clock; a longer lockout already there is kept."""

    @abstractmethod
    async def lockouts(self) -> dict[str, float]:
        """Every client locked out now, with the seconds its lockout has left."""

    @abstractmethod
    async def publish_queue_demand(self, gateway: str, demand: Demand, keep_s: float) -> None:
        """Replace every row of `gateway`'s fair-queue demand (store/queue_demand.py) with
        `demand`, in one transaction, stamped with the store's clock; an empty demand withdraws
        the gateway's rows. Rows of any gateway older than `keep_s` are deleted."""

    @abstractmethod
    async def queue_demands(self, within_s: float) -> list[DemandReport]:
        """Every gateway's demand written in the last `within_s` seconds (this gateway's own
        included), by gateway id."""

    @abstractmethod
    async def announce_peer(self, peer: str, address: str, keep_s: float) -> list[tuple[str, str]]:
        """Record that gateway process `peer`'s bus listens at `address` (gateway/peers/),
        stamped with the store's clock, delete every peer's row older than `keep_s`, and return
        the other peers (id, address) seen within it, by id."""

    @abstractmethod
    async def withdraw_peer(self, peer: str) -> None:
        """Delete `peer`'s row: it stopped."""
