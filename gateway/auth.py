"""Client authentication: who is calling, and may they use this model.

Keys are checked against an in-memory copy of the key table that a background loop refreshes
(every `key_refresh_interval_s`, a second by default). The request path never waits on the
store: a key id the copy does not hold is refused like any other bad key, so a key made a
moment ago by `llmgw key create` (another process, writing the store) works from the next
refresh on. What this buys: an unknown key id and a real one cost the same work (a sha256 and a
constant-time compare against a hash), so the time an answer takes does not tell a prober which
key ids exist, and a store outage does not stop keys the gateway already knows.

Every refusal is the same 401 (same message, code and headers); which check failed is logged
and kept on the error as `reason` for the metrics, never shown to the client.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from datetime import UTC, datetime
from typing import Protocol

from gateway.errors import ApiError
from store import ApiKey
from store.keyformat import parse_key_id

log = logging.getLogger(__name__)

UNAUTHORIZED_MESSAGE = (
    "Invalid or missing API key. Send a valid key as 'Authorization: Bearer llmgw-...'."
)
# Compared against when the key id is unknown, so that path does the compare a known id does.
# The same length as a real hash (64 hex digits) and never equal to one (not hex).
_NO_HASH = b"-" * 64

# Why a key was refused: a bounded set, used as a metric label.
MISSING_KEY = "missing_key"
MALFORMED_KEY = "malformed_key"
UNKNOWN_KEY = "unknown_key"
WRONG_SECRET = "wrong_secret"  # noqa: S105 - a metric label, not a secret
REVOKED = "revoked"
EXPIRED = "expired"


class AuthFailed(ApiError):
    """A refused API key. The client sees one 401 whatever the reason; `reason` is for the
    server's log and metrics."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            401,
            UNAUTHORIZED_MESSAGE,
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        self.reason = reason


def _refused(reason: str, key_id: str | None = None) -> AuthFailed:
    # Info, not warning: a mistyped key is routine. The lockout (gateway/lockout.py) bounds how
    # many of these lines one address can cause.
    log.info("refused an API key: %s%s", reason, f" (key id {key_id})" if key_id else "")
    return AuthFailed(reason)


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise _refused(MISSING_KEY)
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if not token or scheme.lower() != "bearer":
        raise _refused(MALFORMED_KEY)
    return token


class KeySource(Protocol):
    """The part of the store authentication reads: the whole key table, off the request path."""

    async def list_keys(self) -> list[ApiKey]: ...


class KeyCache:
    def __init__(self, store: KeySource) -> None:
        self._store = store
        self._keys: dict[str, ApiKey] = {}
        # key id -> its key_hash as bytes, made with each copy rather than per request.
        self._hashes: dict[str, bytes] = {}

    async def refresh(self) -> None:
        """Replace the copy with the store's key table (the background loop's step)."""
        keys = await self._store.list_keys()
        self._keys = {key.key_id: key for key in keys}
        self._hashes = {key.key_id: key.key_hash.encode() for key in keys}

    def known(self) -> list[ApiKey]:
        return list(self._keys.values())

    def find(self, key_id: str) -> ApiKey | None:
        """The copy's record of one key (revoked and expired ones included), by id."""
        return self._keys.get(key_id)

    async def authenticate(self, authorization: str | None) -> ApiKey:
        """The key behind an Authorization header, or AuthFailed (a 401). Reads the in-memory
        copy only; async so callers need not change should a check ever need to await."""
        token = bearer_token(authorization)
        key_id = parse_key_id(token)
        if key_id is None:
            raise _refused(MALFORMED_KEY)
        key = self._keys.get(key_id)
        presented = hashlib.sha256(token.encode()).hexdigest().encode()
        # Known or not, the same hash and compare: see the module docstring.
        matches = hmac.compare_digest(presented, self._hashes.get(key_id, _NO_HASH))
        if key is None:
            raise _refused(UNKNOWN_KEY, key_id)
        if not matches:
            raise _refused(WRONG_SECRET, key_id)
        if key.revoked_at is not None:
            raise _refused(REVOKED, key_id)
        # The clock is read only for a key that can expire (most keys cannot).
        if key.expires_at is not None and key.is_expired(datetime.now(UTC)):
            raise _refused(EXPIRED, key_id)
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
