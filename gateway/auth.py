"""Client authentication: who is calling, and may they use this model.

Keys are checked against an in-memory copy of the key table that a background loop refreshes
every second, so a request costs no store round trip; a key_id the copy does not know yet (just
created by the CLI) gets one store lookup. Key hashes are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from datetime import UTC, datetime
from typing import Protocol

from gateway.errors import ApiError
from gateway.store import ApiKey
from gateway.store.keyformat import parse_key_id

log = logging.getLogger(__name__)

# Lookups of unknown key_ids are remembered until the next refresh, so a client spraying random
# keys costs at most one store query per distinct key_id per refresh, and never unbounded memory.
MAX_REMEMBERED_MISSES = 10_000


def _unauthorized(message: str) -> ApiError:
    return ApiError(
        401,
        message,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise _unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer llmgw-...'."
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("Expected 'Authorization: Bearer <API key>'.")
    return token.strip()


class KeySource(Protocol):
    """The part of the store authentication reads."""

    async def get_key(self, key_id: str) -> ApiKey | None: ...

    async def list_keys(self) -> list[ApiKey]: ...


class KeyCache:
    def __init__(self, store: KeySource) -> None:
        self._store = store
        self._keys: dict[str, ApiKey] = {}
        self._misses: set[str] = set()

    async def refresh(self) -> None:
        keys = await self._store.list_keys()
        self._keys = {key.key_id: key for key in keys}
        self._misses = set()

    def known(self) -> list[ApiKey]:
        return list(self._keys.values())

    async def lookup(self, key_id: str) -> ApiKey | None:
        key = self._keys.get(key_id)
        if key is not None or key_id in self._misses:
            return key
        if len(self._misses) >= MAX_REMEMBERED_MISSES:
            return None
        try:
            key = await self._store.get_key(key_id)
        except Exception as exc:
            log.warning("key lookup failed: %s", exc)
            raise ApiError(
                503,
                "The key store is unavailable; try again shortly.",
                type_="server_error",
                code="store_unavailable",
                headers={"Retry-After": "2"},
            ) from exc
        if key is None:
            self._misses.add(key_id)
        else:
            self._keys[key_id] = key
        return key

    async def authenticate(self, authorization: str | None) -> ApiKey:
        """The key behind an Authorization header, or a 401 ApiError."""
        token = bearer_token(authorization)
        key_id = parse_key_id(token)
        key = await self.lookup(key_id) if key_id else None
        presented = hashlib.sha256(token.encode()).hexdigest().encode()
        # The hash of a real record, or of nothing: compare either way so a wrong secret and an
        # unknown key_id take the same path.
        expected = key.key_hash.encode() if key else b"0" * len(presented)
        if not hmac.compare_digest(presented, expected) or key is None:
            raise _unauthorized("Incorrect API key provided.")
        if key.revoked_at is not None:
            raise _unauthorized("This API key has been revoked.")
        if key.is_expired(datetime.now(UTC)):
            raise _unauthorized("This API key has expired.")
        return key


def ensure_model_allowed(key: ApiKey, model: str) -> None:
    if not key.allows_model(model):
        raise ApiError(
            403,
            f"This API key is not allowed to use the model '{model}'.",
            param="model",
            code="model_not_allowed",
        )


def ensure_adapter_allowed(key: ApiKey, adapter: str | None) -> None:
    if adapter is not None and not key.allows_adapter(adapter):
        raise ApiError(
            403,
            f"This API key is not allowed to use the LoRA adapter '{adapter}'.",
            param="model",
            code="adapter_not_allowed",
        )
