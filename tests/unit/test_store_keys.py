"""Key allowlists, limits and upstream keys, against both backends (fixtures from test_store)."""

# Fixtures are imported by name and then requested as parameters of the same name.
# ruff: noqa: F811

from __future__ import annotations

from datetime import date

import pytest
from pydantic import ValidationError

from store import KeyLimits, Store, UsageDelta
from store.models import DEFAULT_PRIORITY, PRIORITY_CLASSES
from tests.unit.test_store import StoreFactory, backend, open_test_store, store  # noqa: F401


async def test_adapters_and_limits_are_kept_with_the_key(
    store: Store, open_test_store: StoreFactory
) -> None:
    limits = KeyLimits(rpm=60, tpm=10_000, token_budget=2_000_000, budget_period="month")
    record, _ = await store.create_key(
        "tuned", models=["base"], adapters=["sql-lora", "chat-lora"], limits=limits
    )
    reread = await (await open_test_store()).get_key(record.key_id)
    assert reread is not None
    assert reread.adapters == ["chat-lora", "sql-lora"]
    assert reread.limits == limits
    assert reread.allows_adapter("sql-lora")
    assert not reread.allows_adapter("other-lora")


async def test_a_key_without_lists_or_limits_allows_everything(store: Store) -> None:
    record, _ = await store.create_key("open")
    reread = await store.get_key(record.key_id)
    assert reread is not None
    assert reread.adapters is None
    assert reread.allows_adapter("anything")
    assert reread.limits == KeyLimits()
    assert reread.limits.is_unlimited()


async def test_an_empty_adapter_list_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="at least one adapter"):
        await store.create_key("none", adapters=[])
    assert await store.list_keys() == []


@pytest.mark.parametrize(
    "fields", [{"rpm": 0}, {"tpm": -5}, {"token_budget": 0}, {"budget_period": "week"}]
)
def test_limits_below_one_or_unknown_periods_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as caught:
        KeyLimits.model_validate(fields)
    assert next(iter(fields)) in str(caught.value)


def test_a_budget_counts_from_the_start_of_its_utc_day_or_month() -> None:
    today = date(2025, 2, 17)
    assert KeyLimits(token_budget=1).budget_start(today) == today
    assert KeyLimits(token_budget=1, budget_period="month").budget_start(today) == date(2025, 2, 1)


async def test_a_budget_resumes_from_what_the_store_counted(store: Store) -> None:
    # A gateway starting mid-month learns what the key already spent this month.
    limits = KeyLimits(token_budget=1000, budget_period="month")
    record, _ = await store.create_key("metered", limits=limits)
    await store.add_usage(
        [
            UsageDelta(key_id=record.key_id, model="m", day=date(2025, 1, 31), prompt_tokens=500),
            UsageDelta(key_id=record.key_id, model="m", day=date(2025, 2, 1), prompt_tokens=70),
            UsageDelta(key_id=record.key_id, model="n", day=date(2025, 2, 16), completion_tokens=5),
        ]
    )
    since = limits.budget_start(date(2025, 2, 17))
    assert await store.spent_tokens(record.key_id, since) == 75


async def test_limits_change_on_the_active_key_by_name_or_id(
    store: Store, open_test_store: StoreFactory
) -> None:
    old, _ = await store.create_key("ci", limits=KeyLimits(rpm=10))
    await store.revoke_key("ci")
    current, _ = await store.create_key("ci", limits=KeyLimits(rpm=10))

    updated = await store.set_key_limits("ci", KeyLimits(tpm=500, token_budget=9, rpm=None))
    assert updated is not None
    assert updated.key_id == current.key_id
    assert updated.limits == KeyLimits(tpm=500, token_budget=9)
    by_id = await store.set_key_limits(current.key_id, KeyLimits())
    assert by_id is not None
    assert by_id.limits.is_unlimited()

    other_process = await open_test_store()
    revoked = await other_process.get_key(old.key_id)
    assert revoked is not None, "revoked key untouched"
    assert revoked.limits == KeyLimits(rpm=10), "revoked key untouched"
    assert await store.set_key_limits(old.key_id, KeyLimits(rpm=1)) is None
    assert await store.set_key_limits("nobody", KeyLimits(rpm=1)) is None


async def test_cache_isolation_is_kept_with_the_key_and_changed_with_its_limits(
    store: Store, open_test_store: StoreFactory
) -> None:
    limits = KeyLimits(rpm=5, isolate_cache=True)
    isolated, _ = await store.create_key("tenant-a", limits=limits)
    shared, _ = await store.create_key("tenant-b")
    other_process = await open_test_store()
    reread = await other_process.get_key(isolated.key_id)
    assert reread is not None
    assert reread.limits == limits
    assert reread.limits.isolate_cache is True
    plain = await other_process.get_key(shared.key_id)
    assert plain is not None
    assert plain.limits.isolate_cache is False, "a key shares the cache unless told otherwise"

    updated = await store.set_key_limits("tenant-a", KeyLimits(rpm=5))
    assert updated is not None
    assert updated.limits.isolate_cache is False
    updated = await store.set_key_limits("tenant-b", KeyLimits(isolate_cache=True))
    assert updated is not None
    assert updated.limits.isolate_cache is True
    # A dump carries it (what `llmgw store migrate` copies).
    dumped = {k.name: k.limits.isolate_cache for k in (await store.export_dump()).keys}
    assert dumped == {"tenant-a": False, "tenant-b": True}


async def test_weight_and_top_priority_are_kept_with_the_key_and_changed_with_its_limits(
    store: Store, open_test_store: StoreFactory
) -> None:
    limits = KeyLimits(rpm=5, weight=2.5, top_priority="critical")
    favoured, _ = await store.create_key("favoured", limits=limits)
    plain, _ = await store.create_key("plain")
    other_process = await open_test_store()
    reread = await other_process.get_key(favoured.key_id)
    assert reread is not None
    assert reread.limits == limits
    default = await other_process.get_key(plain.key_id)
    assert default is not None
    assert (default.limits.weight, default.limits.top_priority) == (1.0, "interactive")

    updated = await store.set_key_limits("plain", KeyLimits(weight=0.25, top_priority="batch"))
    assert updated is not None
    assert (updated.limits.weight, updated.limits.top_priority) == (0.25, "batch")
    # Limits are replaced whole: left out, they go back to the defaults.
    updated = await store.set_key_limits("favoured", KeyLimits(rpm=5))
    assert updated is not None
    assert (updated.limits.weight, updated.limits.top_priority) == (1.0, "interactive")
    reread = await (await open_test_store()).get_key(plain.key_id)
    assert reread is not None
    assert (reread.limits.weight, reread.limits.top_priority) == (0.25, "batch")
    # A dump carries them (what `llmgw store migrate` copies).
    dumped = {
        k.name: (k.limits.weight, k.limits.top_priority) for k in (await store.export_dump()).keys
    }
    assert dumped == {"favoured": (1.0, "interactive"), "plain": (0.25, "batch")}


@pytest.mark.parametrize(
    "fields",
    [
        {"weight": 0},
        {"weight": -1},
        {"weight": 1000.5},
        {"weight": float("nan")},
        {"weight": float("inf")},
        {"weight": True},
        {"weight": "2"},
        {"weight": None},
        {"top_priority": "urgent"},
        {"top_priority": "Critical"},
    ],
)
def test_a_weight_out_of_range_or_an_unknown_class_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as caught:
        KeyLimits.model_validate(fields)
    assert next(iter(fields)) in str(caught.value)


def test_the_priority_classes_highest_first() -> None:
    assert PRIORITY_CLASSES == ("critical", "interactive", "standard", "batch")
    assert DEFAULT_PRIORITY in PRIORITY_CLASSES
    assert KeyLimits().top_priority == "interactive"
    assert KeyLimits(weight=1000).weight == 1000.0


async def test_upstream_keys_are_set_replaced_and_deleted(
    store: Store, open_test_store: StoreFactory
) -> None:
    await store.set_upstream_key("gpt-4o", "sk-first")
    await store.set_upstream_key("claude/sonnet", "sk-ant-abc")
    await store.set_upstream_key("gpt-4o", "sk-second")
    other_process = await open_test_store()
    assert await other_process.upstream_keys() == {
        "gpt-4o": "sk-second",
        "claude/sonnet": "sk-ant-abc",
    }
    await store.set_upstream_key("gpt-4o", None)
    await store.set_upstream_key("never-set", None)  # deleting nothing is not an error
    assert await other_process.upstream_keys() == {"claude/sonnet": "sk-ant-abc"}


async def test_upstream_keys_do_not_disturb_the_master_secret(store: Store) -> None:
    secret = await store.master_secret()
    await store.set_upstream_key("engine_master", "sk-looks-like-a-row-name")
    assert await store.master_secret() == secret
    assert await store.upstream_keys() == {"engine_master": "sk-looks-like-a-row-name"}


@pytest.mark.parametrize("bad", ["", "sk with space", "sk\nInjected: header", "sk-\x00", "ключ"])
async def test_an_unusable_upstream_key_is_refused_without_echoing_it(
    store: Store, bad: str
) -> None:
    with pytest.raises(ValueError, match="invalid upstream key") as caught:
        await store.set_upstream_key("gpt-4o", bad)
    if bad:
        assert bad not in str(caught.value), "a secret must not land in an error message"
    assert await store.upstream_keys() == {}


async def test_the_admin_role_is_kept_and_travels_in_a_dump(
    store: Store, open_test_store: StoreFactory
) -> None:
    admin, _ = await store.create_key("ops", admin=True)
    plain, _ = await store.create_key("app")
    assert (admin.admin, plain.admin) == (True, False)
    # Read back by another store on the same database, not from a cache.
    other = await open_test_store()
    roles = {key.name: key.admin for key in await other.list_keys()}
    assert roles == {"ops": True, "app": False}
    dump = await other.export_dump()
    await other.revoke_key("ops")
    await other.import_dump(dump)
    restored = await other.get_key(admin.key_id)
    assert restored is not None
    assert restored.admin is True
    assert restored.revoked_at is None


async def test_prompt_logging_is_kept_with_the_key_and_changed_with_its_limits(
    store: Store, open_test_store: StoreFactory
) -> None:
    audited, _ = await store.create_key("audited", limits=KeyLimits(log_prompts=True))
    plain, _ = await store.create_key("plain")
    other_process = await open_test_store()
    reread = await other_process.get_key(audited.key_id)
    assert reread is not None
    assert reread.limits.log_prompts is True
    unread = await other_process.get_key(plain.key_id)
    assert unread is not None
    assert unread.limits.log_prompts is False, "no prompt is kept unless the key asks"
    updated = await store.set_key_limits("audited", KeyLimits())
    assert updated is not None
    assert updated.limits.log_prompts is False
    dumped = {k.name: k.limits.log_prompts for k in (await store.export_dump()).keys}
    assert dumped == {"audited": False, "plain": False}
