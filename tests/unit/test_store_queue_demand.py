"""The fair queue's demand shared through the store (store/queue_demand.py), on both backends
(fixtures from test_store): a gateway's report replaces its last in one go, an empty one
withdraws it, old rows are not read and are deleted by whoever writes next, and a bad row of
one gateway does not hide the others'."""

# Fixtures are imported by name and then requested as parameters of the same name.
# ruff: noqa: F811

from __future__ import annotations

import asyncio

import pytest

from store import Store
from store.queue_demand import decode_demand
from tests.unit.test_store import (  # noqa: F401
    Backend,
    StoreFactory,
    backend,
    open_test_store,
    store,
)


async def test_a_report_replaces_the_gateways_last_and_others_see_it(
    open_test_store: StoreFactory,
) -> None:
    first, second = await open_test_store(), await open_test_store()
    await first.publish_queue_demand(
        "gw-1", {"smol": {"k1": (1.0, 5, 2), "k2": (2.0, 0, 1)}, "big": {"k1": (1.0, 1, 0)}}, 10
    )
    await second.publish_queue_demand("gw-2", {"smol": {"k1": (1.0, 7, 3)}}, 10)
    reports = await second.queue_demands(10)
    assert [r.gateway for r in reports] == ["gw-1", "gw-2"]
    assert reports[0].demand == {
        "smol": {"k1": (1.0, 5, 2), "k2": (2.0, 0, 1)},
        "big": {"k1": (1.0, 1, 0)},
    }
    assert all(0 <= r.age_s < 5 for r in reports)
    # The next report replaces the whole of the last: a model it no longer names is gone.
    await first.publish_queue_demand("gw-1", {"smol": {"k2": (2.0, 3, 1)}}, 10)
    reports = await second.queue_demands(10)
    assert reports[0].demand == {"smol": {"k2": (2.0, 3, 1)}}


async def test_an_empty_report_withdraws_the_gateway(store: Store) -> None:
    await store.publish_queue_demand("gw-1", {"smol": {"k1": (1.0, 5, 2)}}, 10)
    await store.publish_queue_demand("gw-2", {"smol": {"k1": (1.0, 1, 0)}}, 10)
    await store.publish_queue_demand("gw-1", {}, 10)
    # A model with no key left says nothing either.
    await store.publish_queue_demand("gw-2", {"smol": {}}, 10)
    assert await store.queue_demands(10) == []


async def test_old_rows_are_not_read_and_are_deleted_by_the_next_writer(store: Store) -> None:
    await store.publish_queue_demand("gone", {"smol": {"k1": (1.0, 9, 4)}}, 10)
    await asyncio.sleep(0.3)
    await store.publish_queue_demand("here", {"smol": {"k2": (1.0, 1, 0)}}, 10)
    assert [r.gateway for r in await store.queue_demands(0.2)] == ["here"]
    assert [r.gateway for r in await store.queue_demands(10)] == ["gone", "here"]
    # A writer deletes rows older than its bound, its own and anyone's.
    await store.publish_queue_demand("here", {"smol": {"k2": (1.0, 2, 0)}}, 0.2)
    assert [r.gateway for r in await store.queue_demands(10)] == ["here"]


async def test_names_are_checked_and_a_bad_row_does_not_hide_the_others(
    store: Store, backend: Backend
) -> None:
    with pytest.raises(ValueError, match="model"):
        await store.publish_queue_demand("gw-1", {"bad\x00model": {"k": (1.0, 1, 0)}}, 10)
    with pytest.raises(ValueError, match="gateway id"):
        await store.publish_queue_demand("", {"smol": {"k": (1.0, 1, 0)}}, 10)
    with pytest.raises(ValueError, match="weight"):
        await store.publish_queue_demand("gw-1", {"smol": {"k": (float("nan"), 1, 0)}}, 10)
    await store.publish_queue_demand("gw-1", {"smol": {"k": (1.0, 1, 0)}}, 10)
    await backend.execute_raw(
        "INSERT INTO queue_demand (gateway, model, demand, updated_at) "
        "SELECT 'odd', 'smol', 'not json', updated_at FROM queue_demand WHERE gateway = 'gw-1'"
    )
    reports = {r.gateway: r.demand for r in await store.queue_demands(10)}
    assert reports == {"gw-1": {"smol": {"k": (1.0, 1, 0)}}, "odd": {"smol": {}}}


def test_rows_that_are_not_three_numbers_per_key_are_left_out() -> None:
    text = '{"a": [1, 2, 3], "b": [1, 2], "c": "x", "d": [true, 1, 1], "e": [2.5, 0, 1]}'
    assert decode_demand(text) == {"a": (1.0, 2, 3), "e": (2.5, 0, 1)}
    assert decode_demand("[1, 2]") == {}
    assert decode_demand('{"a": [NaN, 1, 1]}') == {}


async def test_two_gateways_publishing_at_once_both_land(open_test_store: StoreFactory) -> None:
    stores = [await open_test_store() for _ in range(2)]

    async def rounds(store: Store, gateway: str) -> None:
        for n in range(20):
            await store.publish_queue_demand(gateway, {"smol": {"k": (1.0, n, 1)}}, 10)

    await asyncio.gather(rounds(stores[0], "gw-1"), rounds(stores[1], "gw-2"))
    reports = {r.gateway: r.demand for r in await stores[0].queue_demands(10)}
    assert reports == {"gw-1": {"smol": {"k": (1.0, 19, 1)}}, "gw-2": {"smol": {"k": (1.0, 19, 1)}}}
