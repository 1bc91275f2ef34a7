"""Client key checks, against a real SQLite store."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gateway import auth
from gateway.auth import UNAUTHORIZED_MESSAGE, AuthFailed, KeyCache, ensure_model_allowed
from gateway.errors import ApiError
from store import ApiKey, Store
from workflows.engine_keys import engine_key_from_master


@pytest.fixture
async def cache(store: Store) -> KeyCache:
    cache = KeyCache(store)
    await cache.refresh()
    return cache


async def _rejected(cache: KeyCache, header: str | None, reason: str) -> AuthFailed:
    """Refused with the one 401 every bad key gets; `reason` says which check failed."""
    with pytest.raises(AuthFailed) as caught:
        await cache.authenticate(header)
    assert caught.value.status == 401
    assert caught.value.body() == {
        "error": {
            "message": UNAUTHORIZED_MESSAGE,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert caught.value.headers == {"WWW-Authenticate": "Bearer"}
    assert caught.value.reason == reason
    return caught.value


async def test_valid_key_authenticates(store: Store, cache: KeyCache) -> None:
    record, plaintext = await store.create_key("alice")
    await cache.refresh()
    key = await cache.authenticate(f"Bearer {plaintext}")
    assert key.key_id == record.key_id


async def test_missing_or_malformed_header_is_401(store: Store, cache: KeyCache) -> None:
    _, plaintext = await store.create_key("alice")
    await cache.refresh()
    await _rejected(cache, None, "missing_key")
    await _rejected(cache, "", "missing_key")
    await _rejected(cache, plaintext, "malformed_key")  # no scheme
    await _rejected(cache, f"Basic {plaintext}", "malformed_key")
    await _rejected(cache, "Bearer ", "malformed_key")
    await _rejected(cache, "Bearer llmgw-nothex00-" + "a" * 43, "malformed_key")


async def test_wrong_secret_for_a_real_key_id_is_401(store: Store, cache: KeyCache) -> None:
    _, plaintext = await store.create_key("alice")
    await cache.refresh()
    forged = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    await _rejected(cache, f"Bearer {forged}", "wrong_secret")


async def test_an_engine_key_is_not_a_client_key(store: Store, cache: KeyCache) -> None:
    engine_key = engine_key_from_master(await store.master_secret(), "node-a", "m-0")
    await _rejected(cache, f"Bearer {engine_key}", "malformed_key")


async def test_the_reason_is_logged_but_never_answered(
    store: Store, cache: KeyCache, caplog: pytest.LogCaptureFixture
) -> None:
    _, plaintext = await store.create_key("alice")
    await store.revoke_key("alice")
    await cache.refresh()
    caplog.set_level(logging.INFO, logger="gateway.auth")
    error = await _rejected(cache, f"Bearer {plaintext}", "revoked")
    assert "revoked" not in json.dumps(error.body())
    key_id = plaintext.split("-")[1]
    assert f"refused an API key: revoked (key id {key_id})" in caplog.text


async def test_hashes_are_compared_with_compare_digest(
    store: Store, cache: KeyCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    record, plaintext = await store.create_key("alice")
    await cache.refresh()
    seen: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return hmac.compare_digest(a, b)

    monkeypatch.setattr(auth, "hmac", SimpleNamespace(compare_digest=spy))
    wrong = plaintext[:-2] + ("xy" if not plaintext.endswith("xy") else "zz")
    unknown = f"llmgw-0badc0de-{'B' * 43}"
    await _rejected(cache, f"Bearer {wrong}", "wrong_secret")
    await _rejected(cache, f"Bearer {unknown}", "unknown_key")
    await cache.authenticate(f"Bearer {plaintext}")
    digest = hashlib.sha256(unknown.encode()).hexdigest().encode()
    assert seen[0] == (
        hashlib.sha256(wrong.encode()).hexdigest().encode(),
        record.key_hash.encode(),
    )
    # An unknown key id is hashed and compared too, against a hash of the same length.
    assert seen[1][0] == digest
    assert len(seen[1][1]) == len(digest) != 0
    assert seen[2] == (record.key_hash.encode(), record.key_hash.encode())


async def test_revoked_key_is_refused_after_the_next_refresh(store: Store, cache: KeyCache) -> None:
    _, plaintext = await store.create_key("alice")
    await cache.refresh()
    await cache.authenticate(f"Bearer {plaintext}")
    await store.revoke_key("alice")
    await cache.refresh()
    await _rejected(cache, f"Bearer {plaintext}", "revoked")


async def test_expired_key_is_refused(store: Store, cache: KeyCache) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    _, plaintext = await store.create_key("old", expires_at=past)
    await cache.refresh()
    await _rejected(cache, f"Bearer {plaintext}", "expired")


class WatchedStore:
    """The key table, from a store that counts every read and can be taken down."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads = 0
        self.down = False

    async def list_keys(self) -> list[ApiKey]:
        self.reads += 1
        if self.down:
            raise ConnectionError("the store is down")
        return await self.inner.list_keys()

    async def get_key(self, key_id: str) -> ApiKey | None:
        raise AssertionError("the request path looked a key up in the store")


async def test_an_unknown_key_id_never_reaches_the_store(store: Store) -> None:
    """A store round trip only for unknown key ids would let a prober time which ids exist."""
    watched = WatchedStore(store)
    cache = KeyCache(watched)
    await cache.refresh()
    reads = watched.reads
    for _ in range(3):
        await _rejected(cache, f"Bearer llmgw-0badc0de-{'a' * 43}", "unknown_key")
    assert watched.reads == reads


async def test_known_keys_work_while_the_store_is_down(store: Store) -> None:
    _, plaintext = await store.create_key("alice")
    watched = WatchedStore(store)
    cache = KeyCache(watched)
    await cache.refresh()
    watched.down = True
    assert (await cache.authenticate(f"Bearer {plaintext}")).name == "alice"
    with pytest.raises(ConnectionError):
        await cache.refresh()  # the background loop logs it and keeps the last copy
    assert (await cache.authenticate(f"Bearer {plaintext}")).name == "alice"


async def test_a_key_created_after_the_last_refresh_works_from_the_next(store: Store) -> None:
    cache = KeyCache(store)
    await cache.refresh()
    _, plaintext = await store.create_key("new")  # the CLI, in another process
    await _rejected(cache, f"Bearer {plaintext}", "unknown_key")
    await cache.refresh()
    assert (await cache.authenticate(f"Bearer {plaintext}")).name == "new"


async def test_model_allowlist(store: Store) -> None:
    limited, _ = await store.create_key("limited", models=["small"])
    open_key, _ = await store.create_key("open")
    ensure_model_allowed(limited, "small")
    ensure_model_allowed(open_key, "anything")
    with pytest.raises(ApiError) as caught:
        ensure_model_allowed(limited, "big")
    assert caught.value.status == 403
    assert caught.value.body()["error"]["param"] == "model"
