"""The gateway's own subscriptions to external engines' KV-cache events, for the router's
"kv_prefix" choice (gateway/routing/prefix_choice.py).

An external model whose URLs are vLLM servers may name each one's KV-event publisher
(Profile.external_kv; docs/external-models.md). No node agent runs beside those engines to serve
a feed, so every gateway connects to each publisher itself: a KvSubscriber
(kv/subscriber.py) with `connect=True`, whose events go into the same KvBlockIndex the
agents' feeds fill (gateway/kv/feeds.py). The same resets as a feed: a publisher that restarted,
a gap the engine cannot replay (or no replay socket to ask), an event of an unknown kind, a
dropped connection or a silent one (ZMTP heartbeats) forget that engine's blocks, and its next
events rebuild them. A subscriber that fails outright is started again, from nothing, after
RESTART_FIRST_S doubling to RESTART_MAX_S.

`KvPublishers` keeps one subscription per distinct (publisher, replay, topic) among READY routes
whose `kv` names a publisher: `retain` on each new routing table starts the new ones and stops
the gone ones, whose replicas are forgotten. Two routes naming one publisher (one engine listed
by two models) share the subscription, and each gets the blocks.

Trust: the hop is vLLM's plain ZMQ, neither authenticated nor encrypted. The decoder reads
msgpack only and never unpickles (kv/events.py), and a frame over the decoder's bound
ends the connection, so the worst a forged or tampered stream can do is steer the router
toward or away from a replica (a request still goes only to a ready route of its model).
Keep the engines' event ports on a network only they and the gateways reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict, dataclass
from typing import Any

import zmq.asyncio

from gateway.routing.snapshot import RoutingSnapshot
from kv.events import Event
from kv.index import KvBlockIndex
from kv.subscriber import HEARTBEAT_S, SILENCE_S, KvCounters, KvSubscriber
from workflows.contracts import KvSource, ReplicaState, Route

log = logging.getLogger(__name__)

RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0

# (publisher, replay, topic): what one subscription listens to.
SourceKey = tuple[str, str, str]


def source_key(kv: KvSource) -> SourceKey:
    return (kv.publisher, kv.replay, kv.topic)


@dataclass
class PublisherCounters(KvCounters):
    """A subscription's counts over every subscriber it ran, and how many of them failed."""

    failures: int = 0


class _Fanout:
    """A KvSink putting one engine's events in the index under every replica naming it."""

    def __init__(self, index: KvBlockIndex, replicas: set[str]) -> None:
        self.index = index
        self.replicas = replicas

    def apply(self, _source: str, events: list[Event]) -> None:
        for replica_id in self.replicas:
            for event in events:
                if not self.index.apply(replica_id, event):
                    self.index.reset(replica_id)

    def reset(self, _source: str) -> None:
        for replica_id in self.replicas:
            self.index.reset(replica_id)


class KvSubscription:
    """One publisher's subscriber, started again when it fails, until stopped."""

    def __init__(
        self,
        key: SourceKey,
        index: KvBlockIndex,
        replicas: set[str],
        counters: PublisherCounters,
        context: zmq.asyncio.Context,
        timing: tuple[float, float, float, float],
    ) -> None:
        self.key = key
        self.counters = counters
        self.last_error: str | None = None
        self._sink = _Fanout(index, set(replicas))
        self._context = context
        self._timing = timing
        self._subscriber: KvSubscriber | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def replicas(self) -> set[str]:
        return set(self._sink.replicas)

    @property
    def connected(self) -> bool:
        return self._subscriber is not None and self._subscriber.connected

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kv-publisher {self.key[0]}")

    def stop(self) -> asyncio.Task[None] | None:
        """Stop listening and forget the replicas' blocks at once; the task, if any, ends on
        the loop's next turn."""
        self._sink.reset(self.key[0])
        self._sink.replicas = set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    def follow(self, replicas: set[str]) -> None:
        """Feed exactly these replicas: one that left is forgotten, one that joined gets what
        the others hold now."""
        index, held = self._sink.index, self._sink.replicas
        for replica_id in held - replicas:
            index.reset(replica_id)
        siblings = held & replicas
        source = next(iter(sorted(siblings)), None)
        for replica_id in sorted(replicas - held):
            index.reset(replica_id)
            if source is not None:
                index.store(replica_id, index.blocks(source))
        self._sink.replicas = set(replicas)

    async def _run(self) -> None:
        publisher, replay, topic = self.key
        heartbeat_s, silence_s, first_s, max_s = self._timing
        delay = first_s
        while True:
            self._subscriber = KvSubscriber(
                publisher,
                publisher,
                replay,
                topic,
                self._sink,
                context=self._context,
                connect=True,
                counters=self.counters,
                heartbeat_s=heartbeat_s,
                silence_s=silence_s,
            )
            try:
                await self._subscriber.run()
            except Exception as exc:  # noqa: BLE001 - never out of the gateway: counted, retried
                self.counters.failures += 1
                why = repr(exc)
                if why != self.last_error:
                    log.warning("KV events of %s: subscriber failed: %s", publisher, why)
                self.last_error = why
            self._sink.reset(publisher)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_s)

    def describe(self) -> dict[str, Any]:
        publisher, replay, topic = self.key
        subscriber = self._subscriber
        return {
            "publisher": publisher,
            "replay": replay,
            "topic": topic,
            "connected": self.connected,
            "engine_seq": subscriber.last_seq if subscriber is not None else None,
            "last_error": self.last_error,
            "replicas": sorted(self._sink.replicas),
            "counters": asdict(self.counters),
        }


class KvPublishers:
    """The gateway's subscriptions to external engines; see the module's docstring."""

    def __init__(
        self,
        index: KvBlockIndex,
        *,
        context: zmq.asyncio.Context | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        silence_s: float = SILENCE_S,
        first_restart_s: float = RESTART_FIRST_S,
        max_restart_s: float = RESTART_MAX_S,
    ) -> None:
        self.index = index
        # Made at the first subscription, so a gateway without one starts no ZMQ thread.
        self._context = context
        self._owns_context = context is None
        self._timing = (heartbeat_s, silence_s, first_restart_s, max_restart_s)
        self._subscriptions: dict[SourceKey, KvSubscription] = {}
        # Kept across a subscription's stop and start: counters only grow, as Prometheus
        # expects.
        self._counters: dict[SourceKey, PublisherCounters] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def subscriptions(self) -> list[KvSubscription]:
        return list(self._subscriptions.values())

    def watching(self, route: Route) -> bool:
        """Whether the route's KV events reach the index now: its publisher's subscriber is
        connected."""
        if route.kv is None or not route.kv.publisher:
            return False
        subscription = self._subscriptions.get(source_key(route.kv))
        return subscription is not None and subscription.connected

    def counters(self) -> dict[SourceKey, PublisherCounters]:
        return dict(self._counters)

    def retain(self, snapshot: RoutingSnapshot) -> None:
        """Follow a new routing table: a subscription for each publisher its READY routes
        name, none for the rest."""
        routable = ReplicaState.routable()
        wanted: dict[SourceKey, set[str]] = {}
        for route in snapshot.table.routes:
            kv = route.kv
            if kv is not None and kv.publisher and route.state in routable:
                wanted.setdefault(source_key(kv), set()).add(route.replica_id)
        for key in [k for k in self._subscriptions if k not in wanted]:
            task = self._subscriptions.pop(key).stop()
            if task is not None:
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        # Replicas that left a subscription are forgotten before any joins another.
        for key, subscription in self._subscriptions.items():
            subscription.follow(subscription.replicas & wanted[key])
        for key, replicas in sorted(wanted.items()):
            running = self._subscriptions.get(key)
            if running is not None:
                running.follow(replicas)
                continue
            for replica_id in replicas:
                self.index.reset(replica_id)  # what another source said of it is not this one's
            counters = self._counters.setdefault(key, PublisherCounters())
            started = KvSubscription(key, self.index, replicas, counters, self._zmq(), self._timing)
            self._subscriptions[key] = started
            started.start()

    def _zmq(self) -> zmq.asyncio.Context:
        if self._context is None:
            self._context = zmq.asyncio.Context()
        return self._context

    def describe(self) -> list[dict[str, Any]]:
        """For GET /admin/v1/kv."""
        return [s.describe() for s in self._subscriptions.values()]

    async def close(self) -> None:
        tasks = [task for s in self._subscriptions.values() if (task := s.stop())]
        self._subscriptions.clear()
        tasks.extend(self._stopping)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._owns_context and self._context is not None:
            self._context.destroy(linger=0)
            self._context = None
