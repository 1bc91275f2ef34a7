"""The agent's KV feed, put together for the agent process (workers/agent.py): the hub, its HTTP
server on the node's address and feed port, and the subscriptions kept in line with the engines
the supervisor records, looked at every SYNC_EVERY_S and right after each launch.

A feed port that cannot be bound is not fatal: the agent runs its engines without a feed, its
launches then report no KV source, and gateways route those replicas by their own index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from activities.agent.config import AgentConfig
from activities.agent.kv.feed_server import FeedServer, start_feed_server
from activities.agent.kv.hub import KvHub
from activities.agent.kv.subscriptions import KvSubscriptions
from activities.agent.supervisor import ShardSupervisor
from engines.adapter import KvPublisher

SYNC_EVERY_S = 2.0
log = logging.getLogger("llmgw.agent.kv")


def live_publishers(supervisor: ShardSupervisor) -> dict[str, KvPublisher]:
    """The publishers of the engines running now, by replica. Blocking: reads spec files and
    /proc."""
    found: dict[str, KvPublisher] = {}
    for spec in supervisor.shards():
        publisher = spec.publisher()
        if publisher is None or spec.launching:
            continue
        if supervisor.is_alive(spec.replica_id):
            found[spec.replica_id] = publisher
    return found


class KvService:
    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self.hub = KvHub()
        self._subscriptions = KvSubscriptions(self.hub)
        self._server: FeedServer | None = None
        self._loop: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def start(self, supervisor: ShardSupervisor) -> None:
        """Serve the feed when the config asks for one, following `supervisor`'s engines.
        When its port cannot be bound, the config's kv_feed_port becomes 0, so launches report
        no feed that is not there."""
        port = self._config.kv_feed_port
        if port <= 0:
            return
        try:
            self._server = await start_feed_server(
                self.hub, self._config.node_secret, self._config.address, port
            )
        except OSError as err:
            log.error(
                "KV feed off: cannot listen on %s:%d (%s); gateways route this node's "
                "replicas by their own prefix index",
                self._config.address,
                port,
                err,
            )
            self._config.kv_feed_port = 0
            return
        log.info("KV feed on %s:%d", self._config.address, self._server.port)
        self._loop = asyncio.create_task(self._follow(supervisor), name="kv-subscriptions")

    def listening_ports(self) -> set[int]:
        return self._subscriptions.listening_ports()

    def poke(self) -> None:
        """Look at the engines now (an engine was just launched)."""
        self._wake.set()

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        await self._subscriptions.close()
        if self._server is not None:
            await self._server.stop()

    async def _follow(self, supervisor: ShardSupervisor) -> None:
        while True:
            self._wake.clear()
            try:
                publishers = await asyncio.to_thread(live_publishers, supervisor)
                await self._subscriptions.sync(publishers)
            except Exception:  # the feed must outlive any one bad round
                log.exception("KV subscriptions: sync failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SYNC_EVERY_S):
                    await self._wake.wait()
