"""What both backends share between a record and its row: the column order, the encoding of
lists, the checks a row passes before it is written, and new key records.

Only the timestamp encoding differs (PostgreSQL has a type for it, SQLite keeps text), so the
functions here take the backend's converter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

from store.keyformat import hash_api_key, new_api_key, new_key_id
from store.models import ApiKey, KeyLimits, UsageDelta, UsageRow
from store.validate import (
    check_adapters,
    check_key_name,
    check_models,
    check_text,
    utc,
)

MASTER_SECRET_NAME = "engine_master"  # noqa: S105 - a row name, not a secret
# Upstream keys share the secrets table, so a migration copies them with the master secret.
UPSTREAM_KEY_PREFIX = "upstream_key:"

# KeyLimits' fields, each a column of the same name.
LIMIT_COLUMNS = tuple(KeyLimits.model_fields)
KEY_COLUMNS = (
    "key_id",
    "name",
    "key_hash",
    "models",
    "adapters",
    *LIMIT_COLUMNS,
    "created_at",
    "expires_at",
    "revoked_at",
    "admin",
)
# The limits gateways share through leases (store/lease_rules.py): the lease kind -> its column.
LEASED_LIMIT_COLUMNS = {"rpm": "rpm", "tpm": "tpm", "budget": "token_budget"}
USAGE_COLUMNS = ("key_id", "model", "day", "requests", "prompt_tokens", "completion_tokens")

# Columns api_keys gained after the first released schema, with their SQL type (valid in both
# backends). `init()` adds whichever an existing table lacks, and a fresh table is made with
# them (store/schema.py); new ones go at the end. A new per-key limit is a KeyLimits field
# (store/models.py) and a line here: every statement names the columns from KEY_COLUMNS.
ADDED_KEY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("adapters", "TEXT"),
    ("rpm", "BIGINT"),
    ("tpm", "BIGINT"),
    ("token_budget", "BIGINT"),
    ("budget_period", "TEXT NOT NULL DEFAULT 'day'"),
    # NULL, the gateway's default, for every key made before them.
    ("max_prompts_per_request", "BIGINT"),
    ("max_choices_per_request", "BIGINT"),
    ("max_prompt_tokens_per_request", "BIGINT"),
    ("max_inflight_prompt_tokens", "BIGINT"),
    # false for every key made before it: what they always had.
    ("isolate_cache", "BOOLEAN NOT NULL DEFAULT FALSE"),
    # false for every key made before roles: no key opens the remote console until made so.
    ("admin", "BOOLEAN NOT NULL DEFAULT FALSE"),
    # Fair queuing: every key made before them has weight 1 and may use "interactive", the
    # models' defaults (store/models.py), which is how every key was treated until then.
    # DOUBLE PRECISION: 8 bytes in PostgreSQL (its REAL is 4), a REAL in SQLite.
    ("weight", "DOUBLE PRECISION NOT NULL DEFAULT 1.0"),
    ("top_priority", "TEXT NOT NULL DEFAULT 'interactive'"),
    # false for every key made before it: the request log keeps no prompt of theirs.
    ("log_prompts", "BOOLEAN NOT NULL DEFAULT FALSE"),
)


def upstream_secret_name(model: str) -> str:
    return UPSTREAM_KEY_PREFIX + check_text(model, "model")


def encode_names(names: list[str] | None) -> str | None:
    return None if names is None else json.dumps(names, ensure_ascii=False)


def decode_names(text: str | None) -> list[str] | None:
    return None if text is None else list(json.loads(text))


def limit_values(limits: KeyLimits) -> tuple[Any, ...]:
    """The limits as column values, in LIMIT_COLUMNS order."""
    return tuple(getattr(limits, column) for column in LIMIT_COLUMNS)


def key_values(key: ApiKey, ts: Callable[[datetime | None], Any]) -> tuple[Any, ...]:
    """The record as a row, in KEY_COLUMNS order."""
    return (
        key.key_id,
        key.name,
        key.key_hash,
        encode_names(key.models),
        encode_names(key.adapters),
        *limit_values(key.limits),
        # utc(): a hand-made record (an imported dump) may hold naive times; they mean UTC.
        ts(utc(key.created_at)),
        ts(utc(key.expires_at)),
        ts(utc(key.revoked_at)),
        key.admin,
    )


def key_from_row(row: Any, parse_ts: Callable[[Any], datetime | None]) -> ApiKey:
    created = parse_ts(row["created_at"])
    assert created is not None, "created_at is NOT NULL"
    return ApiKey(
        key_id=row["key_id"],
        name=row["name"],
        key_hash=row["key_hash"],
        models=decode_names(row["models"]),
        adapters=decode_names(row["adapters"]),
        limits=KeyLimits(**{column: row[column] for column in LIMIT_COLUMNS}),
        created_at=created,
        expires_at=parse_ts(row["expires_at"]),
        revoked_at=parse_ts(row["revoked_at"]),
        admin=bool(row["admin"]),
    )


def usage_values(row: UsageDelta | UsageRow, day: Callable[[date], Any]) -> tuple[Any, ...]:
    """A delta or row as a row, in USAGE_COLUMNS order, after checking its names."""
    return (
        check_text(row.key_id, "usage key_id"),
        check_text(row.model, "usage model"),
        day(row.day),
        row.requests,
        row.prompt_tokens,
        row.completion_tokens,
    )


class KeyDraft:
    """A validated request for a key; `draw()` makes a record with a fresh key_id each time, so
    a backend retries a (rare) key_id collision without validating again."""

    def __init__(
        self,
        name: str,
        models: list[str] | None,
        expires_at: datetime | None,
        adapters: list[str] | None,
        limits: KeyLimits | None,
        admin: bool = False,
    ) -> None:
        self.name = check_key_name(name)
        self.models = check_models(models)
        self.adapters = check_adapters(adapters)
        self.limits = KeyLimits.model_validate(limits or KeyLimits())
        self.expires_at = utc(expires_at)
        self.created_at = datetime.now(UTC)
        self.admin = bool(admin)

    def draw(self) -> tuple[ApiKey, str]:
        key_id = new_key_id()
        plaintext = new_api_key(key_id)
        record = ApiKey(
            key_id=key_id,
            name=self.name,
            key_hash=hash_api_key(plaintext),
            models=self.models,
            adapters=self.adapters,
            limits=self.limits,
            created_at=self.created_at,
            expires_at=self.expires_at,
            admin=self.admin,
        )
        return record, plaintext
