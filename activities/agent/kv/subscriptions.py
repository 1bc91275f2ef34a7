"""One KvSubscriber task per local replica whose engine publishes KV-cache events, kept in line
with the engines the supervisor records (the agent calls `sync` every few seconds).

A new replica gets a subscriber bound to its publisher's endpoint; a replica gone has its
subscriber cancelled and its blocks dropped from the hub (gateways are told with a reset); a
replica whose publisher moved (a relaunch on other ports) gets a new subscriber. A socket that
cannot be bound (something else holds the port, or a subscriber just stopped on it: ZMQ
releases a closed socket's port a moment later, in its own thread) is logged, counted in the
hub's status and tried again at the next sync: never fatal to the agent, whose engines serve
without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import zmq.asyncio

from activities.agent.kv.hub import KvHub
from engines.adapter import KvPublisher
from kv.subscriber import KvSubscriber

log = logging.getLogger("llmgw.agent.kv")


@dataclass
class _Running:
    publisher: KvPublisher
    subscriber: KvSubscriber
    task: asyncio.Task[None]


class KvSubscriptions:
    def __init__(self, hub: KvHub, context: zmq.asyncio.Context | None = None) -> None:
        self._hub = hub
        self._context = context
        self._running: dict[str, _Running] = {}

    def replicas(self) -> list[str]:
        """The replicas with a subscriber listening."""
        return list(self._running)

    def listening_ports(self) -> set[int]:
        """The loopback ports this agent's subscribers hold: an engine relaunched onto its own
        publisher port must not find it "in use by another process"."""
        return {int(r.publisher.endpoint.rsplit(":", 1)[1]) for r in self._running.values()}

    async def sync(self, publishers: Mapping[str, KvPublisher]) -> None:
        """Subscribe to exactly these replicas' publishers."""
        for replica_id, running in list(self._running.items()):
            if publishers.get(replica_id) != running.publisher or running.task.done():
                # Stopped first, so a new subscriber (this replica's or another's placed on the
                # freed port) can bind the endpoint.
                await self._stop(replica_id)
        for replica_id in self._hub.sources():
            if replica_id not in publishers:
                self._hub.forget(replica_id)  # one whose socket never bound
        for replica_id, publisher in publishers.items():
            if replica_id not in self._running:
                await self._start(replica_id, publisher)

    async def close(self) -> None:
        for replica_id in list(self._running):
            await self._stop(replica_id)

    async def _start(self, replica_id: str, publisher: KvPublisher) -> None:
        subscriber = KvSubscriber(
            replica_id,
            publisher.endpoint,
            publisher.replay_endpoint,
            publisher.topic,
            self._hub,
            context=self._context,
        )
        bound = asyncio.Event()
        task = asyncio.create_task(subscriber.run(bound), name=f"kv-subscriber {replica_id}")
        listening = asyncio.create_task(bound.wait())
        try:
            # Binding happens at the task's first step: one of the two ends at once.
            await asyncio.wait({task, listening}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            listening.cancel()
        if task.done():
            error = task.exception()
            log.warning(
                "KV events of %s: cannot listen on %s (%s); trying again shortly",
                replica_id,
                publisher.endpoint,
                error,
            )
            self._hub.bind_failed(replica_id, publisher.endpoint, str(error))
            return
        self._running[replica_id] = _Running(publisher, subscriber, task)
        self._hub.watch(replica_id, publisher.endpoint, subscriber)

    async def _stop(self, replica_id: str) -> None:
        running = self._running.pop(replica_id)
        if running.task.done() and not running.task.cancelled():
            error = running.task.exception()
            if error is not None:
                log.warning("KV events of %s: subscriber failed: %r", replica_id, error)
        running.task.cancel()
        await asyncio.gather(running.task, return_exceptions=True)
        # Whatever it reported may be stale by now; a new subscriber starts from nothing.
        self._hub.forget(replica_id)
