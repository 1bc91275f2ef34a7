"""The store interface both backends implement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import date, datetime

from gateway.store.models import ApiKey, UsageDelta, UsageRow

MASTER_SECRET_NAME = "engine_master"  # noqa: S105 - a row name, not a secret
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
    @abstractmethod
    async def init(self) -> None:
        """Create the tables if they are missing. Safe to call on every start."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def master_secret(self) -> bytes:
        """The engine-key master secret, created on first use. Every caller, in any process,
        gets the same value: the first writer wins and everyone reads what it wrote."""

    @abstractmethod
    async def create_key(
        self, name: str, models: list[str] | None = None, expires_at: datetime | None = None
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
    async def add_usage(self, rows: list[UsageDelta]) -> None:
        """Add each delta to its (key_id, model, day) totals, all in one transaction."""

    @abstractmethod
    async def usage(
        self, key_id: str | None = None, model: str | None = None, since: date | None = None
    ) -> list[UsageRow]:
        """Totals per (key_id, model, day), filtered, ordered by day then key then model."""
