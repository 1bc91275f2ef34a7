"""The admin API's keys and usage routers, on a small app with the real guards, reached from a
loopback client as the operator's tools would."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import date
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gateway.admin import keys as admin_keys
from gateway.admin import usage as admin_usage
from gateway.auth import AuthFailed, KeyCache
from gateway.errors import install_error_handlers
from store import Store, UsageDelta

JSON = {"Content-Type": "application/json"}
DAY = date(2025, 5, 1)


def _client(
    store: Store, peer: str = "127.0.0.1", gateway: SimpleNamespace | None = None
) -> httpx.AsyncClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(admin_keys.router)
    app.include_router(admin_usage.router)
    # The routers read only the store, the upstream keys and the key copy from the gateway's
    # shared state.
    app.state.gateway = gateway or SimpleNamespace(
        store=store, upstream_keys={}, keys=KeyCache(store)
    )
    transport = httpx.ASGITransport(app=app, client=(peer, 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000")


@pytest.fixture
async def admin(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(store) as client:
        yield client


def _error_code(response: httpx.Response) -> Any:
    return response.json()["error"]["code"]


async def test_a_created_key_is_shown_once_and_works(
    admin: httpx.AsyncClient, store: Store
) -> None:
    body = {
        "name": "ci",
        "models": ["llama"],
        "adapters": ["sql-lora"],
        "limits": {
            "rpm": 60,
            "token_budget": 1000,
            "budget_period": "month",
            "max_prompts_per_request": 16,
        },
    }
    created = await admin.post("/admin/v1/keys", json=body)
    assert created.status_code == 201
    assert created.headers["cache-control"] == "no-store"
    plaintext = created.json()["api_key"]
    key = created.json()["key"]
    assert key["limits"] == {
        "rpm": 60,
        "tpm": None,
        "token_budget": 1000,
        "budget_period": "month",
        "max_prompts_per_request": 16,
        "max_choices_per_request": None,  # None: the gateway's default
        "max_prompt_tokens_per_request": None,
        "max_inflight_prompt_tokens": None,
        "isolate_cache": False,  # the engines' prefix cache is shared unless asked otherwise
        "weight": 1.0,  # an equal share of a saturated model
        "top_priority": "interactive",  # critical only where an operator grants it
        "log_prompts": False,  # the request log keeps no prompt unless asked to
    }
    assert "key_hash" not in key

    cache = KeyCache(store)
    await cache.refresh()
    assert (await cache.authenticate(f"Bearer {plaintext}")).key_id == key["key_id"]

    listed = (await admin.get("/admin/v1/keys")).json()["data"]
    assert [k["name"] for k in listed] == ["ci"]
    assert listed[0]["adapters"] == ["sql-lora"]
    text = str(listed)
    assert plaintext not in text
    assert "key_hash" not in text


async def test_a_key_changed_here_counts_here_at_once(store: Store) -> None:
    """A key created through this gateway's admin API opens its OpenAI API on the very next
    request, and one revoked there stops at once: no wait for the background refresh."""
    keys = KeyCache(store)
    gateway = SimpleNamespace(store=store, upstream_keys={}, keys=keys)
    async with _client(store, gateway=gateway) as admin:
        created = await admin.post("/admin/v1/keys", json={"name": "now"})
        plaintext = created.json()["api_key"]
        assert (await keys.authenticate(f"Bearer {plaintext}")).name == "now"
        assert (await admin.delete("/admin/v1/keys/now", headers=JSON)).status_code == 200
        with pytest.raises(AuthFailed):
            await keys.authenticate(f"Bearer {plaintext}")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "x'; DROP TABLE api_keys;--"}, 400, "invalid_request"),
        ({"name": "ok", "models": ["bad\u202ename"]}, 400, "invalid_request"),
        ({"name": "ok", "limits": {"rpm": 0}}, 400, "invalid_request"),
        ({"name": "ok", "secret_field": 1}, 400, "invalid_request"),
    ],
)
async def test_bad_keys_are_refused_with_the_reason(
    admin: httpx.AsyncClient, store: Store, body: dict[str, Any], status: int, code: str
) -> None:
    response = await admin.post("/admin/v1/keys", json=body)
    assert response.status_code == status
    assert _error_code(response) == code
    assert await store.list_keys() == []


async def test_a_taken_name_is_a_conflict(admin: httpx.AsyncClient) -> None:
    assert (await admin.post("/admin/v1/keys", json={"name": "dup"})).status_code == 201
    again = await admin.post("/admin/v1/keys", json={"name": "dup"})
    assert again.status_code == 409
    assert _error_code(again) == "key_name_taken"


async def test_revoke_then_revoke_again(admin: httpx.AsyncClient, store: Store) -> None:
    await admin.post("/admin/v1/keys", json={"name": "gone"})
    first = await admin.delete("/admin/v1/keys/gone", headers=JSON)
    assert first.status_code == 200
    (key,) = await store.list_keys()
    assert key.revoked_at is not None
    second = await admin.delete("/admin/v1/keys/gone", headers=JSON)
    assert second.status_code == 404
    assert _error_code(second) == "key_not_found"


async def test_limits_are_replaced_by_name_or_id(admin: httpx.AsyncClient, store: Store) -> None:
    created = await admin.post("/admin/v1/keys", json={"name": "svc", "limits": {"rpm": 5}})
    key_id = created.json()["key"]["key_id"]
    put = await admin.put("/admin/v1/keys/svc/limits", json={"tpm": 100})
    assert put.status_code == 200
    assert put.json()["limits"]["rpm"] is None, "PUT replaces: a limit left out is removed"
    assert put.json()["limits"]["tpm"] == 100
    by_id = await admin.put(f"/admin/v1/keys/{key_id}/limits", json={"rpm": 9})
    assert by_id.json()["limits"]["rpm"] == 9
    stored = await store.get_key(key_id)
    assert stored is not None
    assert stored.limits.rpm == 9
    missing = await admin.put("/admin/v1/keys/nobody/limits", json={"rpm": 9})
    assert missing.status_code == 404
    bad = await admin.put("/admin/v1/keys/svc/limits", json={"budget_period": "week"})
    assert bad.status_code == 400


async def test_cache_isolation_is_created_shown_and_replaced_with_the_limits(
    admin: httpx.AsyncClient, store: Store
) -> None:
    body = {"name": "tenant", "limits": {"rpm": 5, "isolate_cache": True}}
    created = await admin.post("/admin/v1/keys", json=body)
    assert created.status_code == 201
    assert created.json()["key"]["limits"]["isolate_cache"] is True
    (listed,) = (await admin.get("/admin/v1/keys")).json()["data"]
    assert listed["limits"]["isolate_cache"] is True
    (stored,) = await store.list_keys()
    assert stored.limits.isolate_cache is True

    # PUT replaces every limit: isolation left out is switched off, like any other.
    put = await admin.put("/admin/v1/keys/tenant/limits", json={"rpm": 5})
    assert put.json()["limits"]["isolate_cache"] is False
    put = await admin.put("/admin/v1/keys/tenant/limits", json={"rpm": 5, "isolate_cache": True})
    assert put.json()["limits"]["isolate_cache"] is True
    bad = await admin.put("/admin/v1/keys/tenant/limits", json={"isolate_cache": "maybe"})
    assert bad.status_code == 400
    assert "isolate_cache" in bad.json()["error"]["message"]


async def test_weight_and_top_priority_are_created_shown_and_replaced_with_the_limits(
    admin: httpx.AsyncClient, store: Store
) -> None:
    body = {"name": "ops", "limits": {"weight": 4, "top_priority": "critical"}}
    created = await admin.post("/admin/v1/keys", json=body)
    assert created.status_code == 201
    limits = created.json()["key"]["limits"]
    assert (limits["weight"], limits["top_priority"]) == (4.0, "critical")
    (listed,) = (await admin.get("/admin/v1/keys")).json()["data"]
    assert (listed["limits"]["weight"], listed["limits"]["top_priority"]) == (4.0, "critical")
    (stored,) = await store.list_keys()
    assert (stored.limits.weight, stored.limits.top_priority) == (4.0, "critical")

    put = await admin.put(
        "/admin/v1/keys/ops/limits", json={"weight": 0.5, "top_priority": "batch"}
    )
    assert put.status_code == 200
    assert (put.json()["limits"]["weight"], put.json()["limits"]["top_priority"]) == (0.5, "batch")
    # PUT replaces every limit: left out, they go back to a new key's.
    put = await admin.put("/admin/v1/keys/ops/limits", json={"rpm": 5})
    assert (put.json()["limits"]["weight"], put.json()["limits"]["top_priority"]) == (
        1.0,
        "interactive",
    )


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"weight": 0}, "weight"),
        ({"weight": -1}, "weight"),
        ({"weight": 1001}, "weight"),
        ({"weight": "2"}, "weight"),
        ({"weight": True}, "weight"),
        ({"weight": None}, "weight"),
        ({"top_priority": "urgent"}, "top_priority"),
        ({"top_priority": 0}, "top_priority"),
        ({"top_priority": None}, "top_priority"),
    ],
)
async def test_a_bad_weight_or_class_is_a_400_naming_it_and_changes_nothing(
    admin: httpx.AsyncClient, store: Store, limits: dict[str, Any], field: str
) -> None:
    created = await admin.post("/admin/v1/keys", json={"name": "svc", "limits": {"weight": 3}})
    assert created.status_code == 201
    put = await admin.put("/admin/v1/keys/svc/limits", json=limits)
    assert put.status_code == 400
    assert _error_code(put) == "invalid_request"
    assert f"{field}:" in put.json()["error"]["message"]
    post = await admin.post("/admin/v1/keys", json={"name": "other", "limits": limits})
    assert post.status_code == 400
    assert f"limits.{field}:" in post.json()["error"]["message"]
    (stored,) = await store.list_keys()
    assert (stored.name, stored.limits.weight, stored.limits.top_priority) == (
        "svc",
        3.0,
        "interactive",
    )


async def test_infinite_or_nan_weights_in_raw_json_are_refused(
    admin: httpx.AsyncClient, store: Store
) -> None:
    # Not JSON, but Python's parser and pydantic's take them; httpx's json= cannot send them.
    await admin.post("/admin/v1/keys", json={"name": "svc"})
    for raw in (b'{"weight": NaN}', b'{"weight": Infinity}', b'{"weight": 1e999}'):
        put = await admin.put("/admin/v1/keys/svc/limits", content=raw, headers=JSON)
        assert put.status_code == 400, raw
        assert "weight" in put.json()["error"]["message"]
    (stored,) = await store.list_keys()
    assert stored.limits.weight == 1.0


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Type": "text/plain"}, 415),
        ({**JSON, "Sec-Fetch-Site": "cross-site"}, 403),
        ({**JSON, "Origin": "http://evil.example"}, 403),
        ({**JSON, "Host": "evil.example"}, 403),
    ],
)
async def test_changes_from_a_browser_page_or_as_a_form_are_refused(
    admin: httpx.AsyncClient, store: Store, headers: dict[str, str], status: int
) -> None:
    response = await admin.post("/admin/v1/keys", content=b'{"name": "sneaky"}', headers=headers)
    assert response.status_code == status
    assert await store.list_keys() == []


async def test_nothing_answers_a_remote_client(store: Store) -> None:
    await store.create_key("private")
    async with _client(store, peer="203.0.113.9") as remote:
        for response in (
            await remote.get("/admin/v1/keys"),
            await remote.get("/admin/v1/usage"),
            await remote.post("/admin/v1/keys", json={"name": "x"}),
        ):
            assert response.status_code == 403
            assert _error_code(response) == "admin_local_only"
    assert [k.name for k in await store.list_keys()] == ["private"]


async def test_an_upstream_key_is_set_used_at_once_and_never_shown(store: Store) -> None:
    gateway = SimpleNamespace(store=store, upstream_keys={})
    async with _client(store, gateway=gateway) as admin:
        await _upstream_key_round_trip(admin, store, gateway)


async def _upstream_key_round_trip(
    admin: httpx.AsyncClient, store: Store, gateway: SimpleNamespace
) -> None:
    secret = "sk-hosted-0123456789"
    put = await admin.put("/admin/v1/models/hosted/upstream-key", json={"key": secret})
    assert put.status_code == 200
    assert secret not in put.text
    assert await store.upstream_keys() == {"hosted": secret}
    assert gateway.upstream_keys == {"hosted": secret}, "this gateway sends it from now on"
    assert secret not in (await admin.get("/admin/v1/keys")).text

    spaced = await admin.put("/admin/v1/models/hosted/upstream-key", json={"key": "sk two"})
    assert spaced.status_code == 400
    assert "sk two" not in spaced.text
    unknown = await admin.put("/admin/v1/models/hosted/upstream-key", json={"value": secret})
    assert unknown.status_code == 400
    cross_site = await admin.put(
        "/admin/v1/models/hosted/upstream-key",
        content=b'{"key": "sk-planted"}',
        headers={**JSON, "Sec-Fetch-Site": "cross-site"},
    )
    assert cross_site.status_code == 403
    assert await store.upstream_keys() == {"hosted": secret}, "refused changes keep the key"

    deleted = await admin.delete("/admin/v1/models/hosted/upstream-key", headers=JSON)
    assert deleted.status_code == 200
    assert await store.upstream_keys() == {}
    assert gateway.upstream_keys == {}
    again = await admin.delete("/admin/v1/models/hosted/upstream-key", headers=JSON)
    assert again.status_code == 404
    assert _error_code(again) == "upstream_key_not_found"


async def _usage(store: Store) -> str:
    record, _ = await store.create_key("ci")
    await store.add_usage(
        [
            UsageDelta(
                key_id=record.key_id,
                model=model,
                day=date(2025, 5, day),
                requests=1,
                prompt_tokens=10,
                completion_tokens=day,
            )
            for day in (1, 2, 3)
            for model in ("llama", "=cmd|calc")
        ]
    )
    return record.key_id


async def test_usage_filters_by_key_model_and_inclusive_period(
    admin: httpx.AsyncClient, store: Store
) -> None:
    key_id = await _usage(store)
    response = await admin.get(
        "/admin/v1/usage",
        params={"key_id": key_id, "model": "llama", "since": "2025-05-02", "until": "2025-05-03"},
    )
    assert response.status_code == 200
    data = response.json()["data"]
    assert [(r["day"], r["model"], r["completion_tokens"]) for r in data] == [
        ("2025-05-02", "llama", 2),
        ("2025-05-03", "llama", 3),
    ]


async def test_usage_as_csv_downloads_a_safe_file(admin: httpx.AsyncClient, store: Store) -> None:
    await _usage(store)
    response = await admin.get("/admin/v1/usage", params={"format": "csv", "until": "2025-05-01"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert response.headers["content-disposition"] == (
        'attachment; filename="llmgw-usage-2025-05-01.csv"'
    )
    rows = list(csv.reader(io.StringIO(response.text)))
    assert rows[0][:4] == ["day", "key_id", "key_name", "model"]
    assert sorted(r[3] for r in rows[1:]) == ["'=cmd|calc", "llama"]
    assert {r[2] for r in rows[1:]} == {"ci"}


@pytest.mark.parametrize(
    "params",
    [
        {"since": "2025-05-03", "until": "2025-05-01"},
        {"model": "bad\x00model"},
        {"since": "yesterday"},
        {"format": "xlsx"},
    ],
)
async def test_bad_usage_queries_are_400(
    admin: httpx.AsyncClient, store: Store, params: dict[str, str]
) -> None:
    await _usage(store)
    response = await admin.get("/admin/v1/usage", params=params)
    assert response.status_code == 400
    assert response.json()["error"]["message"]
