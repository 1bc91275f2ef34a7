"""Client key checks, against a real SQLite store."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway import auth
from gateway.auth import KeyCache, ensure_model_allowed
from gateway.errors import ApiError
from gateway.store import ApiKey, Store, open_store
from workflows.engine_keys import engine_key_from_master


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = open_store(None, tmp_path)
    await store.init()
    yield store
    await store.close()


@pytest.fixture
async def cache(store: Store) -> KeyCache:
    cache = KeyCache(store)
    await cache.refresh()
    return cache


async def _rejected(cache: KeyCache, header: str | None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await cache.authenticate(header)
    assert caught.value.status == 401
    assert caught.value.body()["error"]["code"] == "invalid_api_key"
    assert caught.value.body()["error"]["type"] == "invalid_request_error"
    return caught.value


async def test_valid_key_authenticates(store: Store, cache: KeyCache) -> None:
    record, plaintext = await store.create_key("alice")
    await cache.refresh()
    key = await cache.authenticate(f"Bearer {plaintext}")
    assert key.key_id == record.key_id


async def test_missing_or_malformed_header_is_401(store: Store, cache: KeyCache) -> None:
    _, plaintext = await store.create_key("alice")
    assert "didn't provide" in (await _rejected(cache, None)).message
    await _rejected(cache, "")
    await _rejected(cache, plaintext)  # no scheme
    await _rejected(cache, f"Basic {plaintext}")
    await _rejected(cache, "Bearer ")
    await _rejected(cache, "Bearer llmgw-nothex00-" + "a" * 43)


async def test_wrong_secret_for_a_real_key_id_is_401(store: Store, cache: KeyCache) -> None:
    _, plaintext = await store.create_key("alice")
    forged = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    error = await _rejected(cache, f"Bearer {forged}")
    assert error.message == "Incorrect API key provided."


async def test_an_engine_key_is_not_a_client_key(store: Store, cache: KeyCache) -> None:
    engine_key = engine_key_from_master(await store.master_secret(), "node-a", "m-0")
    await _rejected(cache, f"Bearer {engine_key}")


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
    await _rejected(cache, f"Bearer {wrong}")
    await cache.authenticate(f"Bearer {plaintext}")
    assert seen == [
        (hashlib.sha256(wrong.encode()).hexdigest().encode(), record.key_hash.encode()),
        (record.key_hash.encode(), record.key_hash.encode()),
    ]


async def test_revoked_key_is_refused_after_the_next_refresh(store: Store, cache: KeyCache) -> None:
    _, plaintext = await store.create_key("alice")
    await cache.authenticate(f"Bearer {plaintext}")
    await store.revoke_key("alice")
    await cache.refresh()
    assert "revoked" in (await _rejected(cache, f"Bearer {plaintext}")).message


async def test_expired_key_is_refused(store: Store, cache: KeyCache) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    _, plaintext = await store.create_key("old", expires_at=past)
    assert "expired" in (await _rejected(cache, f"Bearer {plaintext}")).message


class CountingStore:
    """Counts key lookups that reach the store."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.lookups = 0

    async def get_key(self, key_id: str) -> ApiKey | None:
        self.lookups += 1
        return await self.inner.get_key(key_id)

    async def list_keys(self) -> list[ApiKey]:
        return await self.inner.list_keys()


async def test_a_key_created_after_the_last_refresh_works_at_once(store: Store) -> None:
    counting = CountingStore(store)
    cache = KeyCache(counting)
    await cache.refresh()
    _, plaintext = await store.create_key("new")  # the CLI, in another process
    await cache.authenticate(f"Bearer {plaintext}")
    await cache.authenticate(f"Bearer {plaintext}")
    assert counting.lookups == 1, "the first use fetches it, later uses hit the cache"


async def test_unknown_key_ids_cost_one_lookup_per_refresh(store: Store) -> None:
    counting = CountingStore(store)
    cache = KeyCache(counting)
    await cache.refresh()
    probe = "Bearer llmgw-0badc0de-" + "a" * 43
    for _ in range(5):
        await _rejected(cache, probe)
    assert counting.lookups == 1
    await cache.refresh()
    await _rejected(cache, probe)
    assert counting.lookups == 2


async def test_model_allowlist(store: Store) -> None:
    limited, _ = await store.create_key("limited", models=["small"])
    open_key, _ = await store.create_key("open")
    ensure_model_allowed(limited, "small")
    ensure_model_allowed(open_key, "anything")
    with pytest.raises(ApiError) as caught:
        ensure_model_allowed(limited, "big")
    assert caught.value.status == 403
    assert caught.value.body()["error"]["param"] == "model"
