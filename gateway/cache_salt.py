"""Prefix-cache isolation per API key: a key with `isolate_cache` gets a `cache_salt` of its own.

An engine's prefix cache is shared by every request sent to its replica, so how soon a first
token comes back tells one tenant whether another already sent the same prompt prefix. vLLM
hashes a request's `cache_salt` into its first block's hash (`("cache_salt", salt)`), so
requests with different salts never share a cached block. For a key with `isolate_cache`, the
body sent upstream carries the key's own salt: hex HMAC-SHA256(master secret, "cache-salt:" +
key id) (workflows/engine_keys.py), never stored, the same on every gateway and across restarts,
and unknown to every client. A salt the client sent still divides the key's cache further: it
is sent as `<key's salt>:<client's salt>`, so a client can never name another key's salt.

Only when every ready replica of the model is an engine whose row says it takes the salt
(workflows/contracts/engine_facts.py, cache_salt: vLLM): another engine may refuse a field it
does not know, or ignore it (and share its cache regardless), and a request may be retried on
any ready replica. The router hashes the salt the body carries (gateway/proxy.py builds
RequestKey.cache_salt from the body after this), so the blocks it predicts for a request are the
ones the engine will look for, and its own prefix index keys the prompt by the salt
(`salted_prompt`): one key's requests never draw another key's to a replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.errors import bad_request
from gateway.request_body import CACHE_SALT, MAX_CACHE_SALT
from store import ApiKey
from workflows.contracts import Route, engine_facts
from workflows.engine_keys import cache_salt_from_master

# Between the salt and the prompt in a routing prompt (ASCII record separator, as
# gateway/routing/request_key.py uses between a prompt's parts).
_SEPARATOR = b"\x1e"


class CacheSalts:
    """Each key's salt, derived from the master secret once per key id."""

    def __init__(self, master_secret: bytes) -> None:
        self._master = master_secret
        self._cache: dict[str, str] = {}

    def for_key(self, key_id: str) -> str:
        salt = self._cache.get(key_id)
        if salt is None:
            salt = cache_salt_from_master(self._master, key_id)
            self._cache[key_id] = salt
        return salt


def isolates(key: ApiKey, routes: Sequence[Route]) -> bool:
    """Whether this key's request to these (the model's ready) routes gets the key's salt."""
    return key.limits.isolate_cache and bool(routes) and all(takes_salt(r.engine) for r in routes)


def takes_salt(engine: str) -> bool:
    """Whether the engine hashes a request's `cache_salt` into its prefix cache."""
    facts = engine_facts(engine)
    return facts is not None and facts.cache_salt


def salt_body(
    salts: CacheSalts, key: ApiKey, body: dict[str, Any], routes: Sequence[Route]
) -> str | None:
    """Give `body` the key's salt when `isolates(key, routes)`, and return what it now carries;
    None when the body is left as it was. The client's own salt was checked by
    gateway/request_body.py (a string of 1 to MAX_CACHE_SALT characters); with the key's in
    front it must still fit vLLM's bound."""
    if not isolates(key, routes):
        return None
    salt = salts.for_key(key.key_id)
    own = body.get(CACHE_SALT)
    if own is not None:
        salt = f"{salt}:{own}"
        if len(salt) > MAX_CACHE_SALT:
            room = MAX_CACHE_SALT - (len(salt) - len(own))
            raise bad_request(
                f"'{CACHE_SALT}' must be at most {room} characters with this API key: the "
                "gateway puts the key's own salt in front of it.",
                param=CACHE_SALT,
                code="invalid_value",
            )
    body[CACHE_SALT] = salt
    return salt


def salted_prompt(prompt: bytes, salt: str | None) -> bytes:
    """The routing prompt (gateway/routing/request_key.py) of a request `salt_body` salted: the
    salt in front, so the gateway's own prefix index (by bytes, gateway/routing/prefix_index.py)
    keeps each salt's prompts apart as the engine's cache does, and never sends one key's
    request after another key's prompt. Unchanged when `salt` is None."""
    return prompt if salt is None else salt.encode("utf-8", "surrogatepass") + _SEPARATOR + prompt
