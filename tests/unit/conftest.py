"""Fixtures the unit tests share."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.agent.supervisor import ShardSupervisor
from store import Store, open_store
from store.fleet import FleetTables, open_fleet


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh SQLite store of the gateway's, in the test's own directory."""
    store = open_store(None, tmp_path)
    await store.init()
    yield store
    await store.close()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[FleetTables]:
    """The fleet tables of a fresh SQLite store in the test's own directory (the same database
    as `store`'s, as in a cluster)."""
    tables = open_fleet(None, tmp_path)
    await tables.init()
    yield tables
    await tables.close()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A shard supervisor's spec and log directories."""
    return tmp_path / "shards", tmp_path / "logs"


@pytest.fixture
def supervisor(dirs: tuple[Path, Path]) -> Iterator[ShardSupervisor]:
    sup = ShardSupervisor(*dirs)
    yield sup
    sup.stop_all(grace_s=1.0)


@pytest.fixture(scope="module")
def chromium_driver() -> Iterator[Any]:
    """One headless Chromium for a browser test module (tests/browser_kit.py)."""
    from tests.browser_kit import chromium

    with chromium() as driver:
        yield driver


@pytest.fixture
def browser(chromium_driver: Any) -> Any:
    """The module's Chromium, its console log read away first: each test answers for its own
    console errors only."""
    chromium_driver.get_log("browser")
    return chromium_driver
