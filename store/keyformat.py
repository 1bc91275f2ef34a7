"""The client API key format: `llmgw-<key_id: 8 hex>-<secret: 43 urlsafe chars>`.

The key_id travels in the key so the gateway finds the record without scanning; the secret part
is what makes it unguessable. Only sha256(full key) is stored.
"""

from __future__ import annotations

import hashlib
import re
import secrets

API_KEY_PREFIX = "llmgw-"
_KEY_RE = re.compile(r"^llmgw-([0-9a-f]{8})-([A-Za-z0-9_-]{43})$")


def new_key_id() -> str:
    return secrets.token_hex(4)


def new_api_key(key_id: str) -> str:
    # token_urlsafe(32) is 43 characters: 256 bits of randomness.
    return f"{API_KEY_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key_id(key: str) -> str | None:
    """The key_id of a well-formed key, None for anything else (engine keys included)."""
    match = _KEY_RE.match(key)
    return match.group(1) if match else None
