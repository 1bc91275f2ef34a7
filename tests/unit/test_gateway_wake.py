"""A model scaled to zero: the gateway holds a request, wakes the model once, and serves the
request when a replica is ready; past the deadline it answers 503 with Retry-After."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from store import Store, open_store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    assert_openai_error,
    fast_settings,
    recording_upstream,
    route,
    running_gateway,
)
from workflows.contracts import Route, RoutingTable


@pytest.fixture(scope="module")
async def store(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Store]:
    store = open_store(None, tmp_path_factory.mktemp("wake"))
    await store.init()
    yield store
    await store.close()


class WakingSource(FakeRouteSource):
    """A ledger whose model is idle until woken; the replica is ready `delay_s` after the wake."""

    def __init__(self, ready_route: Route, delay_s: float) -> None:
        super().__init__()
        self.table = RoutingTable(version=1, idle_models=[MODEL])
        self.ready_route = ready_route
        self.delay_s = delay_s
        self.wakes: list[str] = []

    async def wake(self, model: str) -> None:
        self.wakes.append(model)

        async def come_up() -> None:
            await asyncio.sleep(self.delay_s)
            self.table = RoutingTable(version=2, routes=[self.ready_route])

        if len(self.wakes) == 1:
            asyncio.get_running_loop().create_task(come_up())


async def test_requests_for_an_idle_model_wait_for_the_replica_it_wakes(store: Store) -> None:
    async with recording_upstream() as upstream:
        source = WakingSource(route("smol-0", upstream.url), delay_s=0.6)
        async with running_gateway(store, source) as gw:
            listed = (await gw.client.get("/v1/models", headers=gw.auth)).json()
            assert MODEL in [m["id"] for m in listed["data"]]  # listed while at zero

            replies = await asyncio.gather(*(gw.chat() for _ in range(5)))
    assert [r.status_code for r in replies] == [200] * 5
    assert source.wakes == [MODEL]  # one wake, however many requests were held
    assert len(upstream.seen) == 5


async def test_a_model_that_does_not_come_up_in_time_gets_503_with_retry_after(
    store: Store,
) -> None:
    source = WakingSource(route("smol-0", "http://127.0.0.1:9"), delay_s=3600)
    settings = fast_settings(cold_start_timeout_s=0.5)
    async with running_gateway(store, source, settings) as gw:
        reply = await gw.chat()
    assert_openai_error(reply, 503, "model_starting")
    assert reply.headers["Retry-After"]
    assert source.wakes == [MODEL]


async def test_an_unknown_model_is_still_404_and_wakes_nothing(store: Store) -> None:
    source = WakingSource(route("smol-0", "http://127.0.0.1:9"), delay_s=3600)
    async with running_gateway(store, source) as gw:
        reply = await gw.chat(model="not-there")
    assert_openai_error(reply, 404, "model_not_found")
    assert source.wakes == []
