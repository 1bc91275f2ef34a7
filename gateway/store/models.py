"""The records the store hands out."""

from __future__ import annotations

from datetime import date, datetime

from pydantic import BaseModel, Field


class ApiKey(BaseModel):
    """One client API key. Only the sha256 of the full key is kept: the plaintext is shown once,
    when the key is created."""

    key_id: str
    name: str
    key_hash: str
    # None means every model; a list limits the key to those model names.
    models: list[str] | None = None
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def allows_model(self, model: str) -> bool:
        return self.models is None or model in self.models


class UsageDelta(BaseModel):
    """Counts to add to one (key, model, UTC day) row."""

    key_id: str
    model: str
    day: date
    requests: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)


class UsageRow(BaseModel):
    """The running totals of one (key, model, UTC day)."""

    key_id: str
    model: str
    day: date
    requests: int
    prompt_tokens: int
    completion_tokens: int
