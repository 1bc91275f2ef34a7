"""The records the store hands out."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Both backends keep counts in signed 64-bit columns; a larger number would surface as a raw
# database overflow instead of a validation error naming the field.
MAX_COUNT = 2**63 - 1

BudgetPeriod = Literal["day", "month"]

# A request's class in the gateway's fair queue: a higher class is served first, and a lower one
# is not starved for ever. A request names its class; a key caps the class it may name.
PriorityClass = Literal["critical", "interactive", "standard", "batch"]
# Highest first.
PRIORITY_CLASSES: tuple[PriorityClass, ...] = ("critical", "interactive", "standard", "batch")
DEFAULT_PRIORITY: PriorityClass = "standard"  # what a request that names none gets
# The highest class a key may use unless told otherwise: "critical" is kept for keys an operator
# grants it, so a client cannot put itself ahead of every interactive user by asking.
DEFAULT_TOP_PRIORITY: PriorityClass = "interactive"
# The most a key's weight may be. Weights are ratios to each other: a key at the bound next to
# one at 1 still leaves the other a thousandth of a saturated model, not nothing.
MAX_WEIGHT = 1000.0


class KeyLimits(BaseModel):
    """What one key may spend, and whether it shares the engines' prefix cache. For the quotas
    (rpm, tpm, token_budget) None means unlimited; the budget counts prompt plus completion
    tokens per UTC day or calendar month."""

    model_config = ConfigDict(extra="forbid")

    rpm: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="requests per minute")
    tpm: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="tokens per minute")
    token_budget: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    budget_period: BudgetPeriod = "day"
    # Request-size limits (gateway/request_limits.py). Here None means the gateway's setting of
    # the same name, not unlimited: a key can be given more or less than the default.
    max_prompts_per_request: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_choices_per_request: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_prompt_tokens_per_request: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    max_inflight_prompt_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    # Prefix-cache isolation (gateway/cache_salt.py): the key's requests to vLLM replicas carry
    # a `cache_salt` of its own, so they never hit blocks another key's requests left cached.
    isolate_cache: bool = False
    # The gateway's request log (gateway/observe/) keeps the text of this key's prompts, cut to
    # a few KB; off, as for every key made before it: no prompt is kept.
    log_prompts: bool = False
    # Fairness under saturation (the gateway's fair queue): new fields, so every key made before
    # them reads as weight 1 and "interactive", which is how every key was treated.
    # strict: a number only; JSON's true or "2" is a mistake, not a weight of 1 or 2.
    weight: float = Field(
        default=1.0,
        gt=0,
        le=MAX_WEIGHT,
        strict=True,
        description="the key's share of a saturated model, relative to other keys' weights: "
        "a key of weight 2 gets twice the tokens of a key of weight 1",
    )
    top_priority: PriorityClass = Field(
        default=DEFAULT_TOP_PRIORITY,
        description="the highest priority class the key's requests may ask for",
    )

    def is_unlimited(self) -> bool:
        """No quota (rpm, tpm, budget): the request-size limits always apply."""
        return self.rpm is None and self.tpm is None and self.token_budget is None

    def budget_start(self, today: date) -> date:
        """The first UTC day the budget counts on `today`: what `Store.spent_tokens` takes."""
        return today.replace(day=1) if self.budget_period == "month" else today


class ApiKey(BaseModel):
    """One client API key. Only the sha256 of the full key is kept: the plaintext is shown once,
    when the key is created."""

    key_id: str
    name: str
    key_hash: str
    # None means every model; a list limits the key to those model names.
    models: list[str] | None = None
    # None means any LoRA adapter (of an allowed model); a list limits the key to those.
    adapters: list[str] | None = None
    limits: KeyLimits = Field(default_factory=KeyLimits)
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    # An admin key also opens the remote web console (gateway/console/remote.py) when the
    # gateway serves it; on the OpenAI API it is an ordinary key.
    admin: bool = False

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def allows_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def allows_adapter(self, name: str) -> bool:
        return self.adapters is None or name in self.adapters


class UsageDelta(BaseModel):
    """Counts to add to one (key, model, UTC day) row."""

    key_id: str
    model: str
    day: date
    requests: int = Field(default=0, ge=0, le=MAX_COUNT)
    prompt_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    completion_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)


class UsageRow(BaseModel):
    """The running totals of one (key, model, UTC day)."""

    key_id: str
    model: str
    day: date
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class StoreDump(BaseModel):
    """Everything a store holds, for moving it to another backend. It carries the engine master
    secret, upstream keys and key hashes: treat it like the database itself."""

    # Secret values are raw bytes; in JSON they travel as base64 so any byte survives.
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    secrets: dict[str, bytes] = Field(default_factory=dict)
    keys: list[ApiKey] = Field(default_factory=list)
    usage: list[UsageRow] = Field(default_factory=list)
