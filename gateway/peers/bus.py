"""The peer bus: how the gateway processes on one store share one picture of the fleet.

Each process (a gateway, or each of `--workers N`) binds two ZeroMQ sockets on `peer_host`, at
free ports: a PUB that sends its batches to every peer, and a ROUTER that answers snapshot
requests. Every ANNOUNCE_S it writes where they are to the store (`gateway_peers`), reads the
other processes' rows, and connects its SUB to each new one and asks it for a snapshot (a
DEALER per request). Every FLUSH_S it sends what its outbox gathered (outbox.py) and its
requests in flight per replica, when they changed or HEARTBEAT_S passed, as one signed batch
(wire.py). What arrives is applied to the router by the picture (picture.py).

Why this path, measured (docs/peer-bus.md, bench/peer_paths.py): gateway to gateway a batch
reaches a peer in about a millisecond on loopback; through the store each message waits for
the next poll, and polling fast enough for a p99 under 100 ms costs every gateway a query
every few tens of milliseconds; through the node agents' feeds each message takes two hops and
the record of a replica would live, and be lost, with its agent. The store is kept for what it
does well: finding the peers.

A process that starts asks its first peer for the whole record (prefix index, working sets) and
every peer for its own requests in flight; `start` waits up to SNAPSHOT_WAIT_S for them, so a
restarted gateway does not serve its first requests cache-blind. A lost batch (a sequence gap)
or a peer silent for STALE_S makes it ask that peer again. Nothing here ever blocks a request:
until the picture is complete, routing reads the engines' gauges and says it is degraded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import zmq
import zmq.asyncio

from gateway.loops import PeriodicTask
from gateway.peers.outbox import PeerOutbox
from gateway.peers.picture import HEARTBEAT_S, BadMessage, SharedPicture, snapshot
from gateway.peers.wire import BadFrame, seal, unseal
from gateway.routing import Router
from store import Store

log = logging.getLogger(__name__)

FLUSH_S = 0.01
ANNOUNCE_S = 1.0
SNAPSHOT_WAIT_S = 5.0
ASK_AGAIN_S = 1.0  # the soonest one peer is asked for a snapshot again


def advertised_host(peer_host: str, gateway_host: str) -> str:
    """Where peers reach this process: `peer_host` if set, else the gateway's host unless that
    is a wildcard, else this machine's name."""
    if peer_host:
        return peer_host
    if gateway_host not in ("", "0.0.0.0", "::"):
        return gateway_host
    return socket.gethostname()


class PeerBus:
    def __init__(
        self,
        store: Store,
        router: Router,
        in_flight: Callable[[], Mapping[str, int]],
        key: bytes,
        host: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = f"{socket.gethostname()}-{secrets.token_hex(4)}"
        self._store = store
        self._in_flight = in_flight
        self._key = key
        self._host = host
        self._clock = clock
        self.outbox = PeerOutbox()
        self.picture = SharedPicture(router)
        self.address = ""
        self._seq = -1
        self._loads_sent: dict[str, int] = {}
        self._loads_at = 0.0
        self._connected: dict[str, str] = {}  # peer -> its address
        self._asked: dict[str, float] = {}  # peer -> when it was last asked for a snapshot
        self._ask_later: dict[str, asyncio.TimerHandle] = {}  # peer -> its ask put off
        self._tasks: set[asyncio.Task[None]] = set()
        self._complete = asyncio.Event()  # set when a snapshot completes the picture
        self._loops: list[PeriodicTask] = []
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._sub = self._context.socket(zmq.SUB)
        self._answers = self._context.socket(zmq.ROUTER)
        self.sent_batches = 0
        self.refused = 0  # frames not signed with the cluster's key, or not understood
        attach(router, self.outbox, self.picture)

    async def start(self) -> None:
        """Listen, find the peers and take their snapshots (up to SNAPSHOT_WAIT_S)."""
        for sock in (self._pub, self._sub, self._answers):
            sock.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        pub_port = self._pub.bind_to_random_port(f"tcp://{self._host}")
        ask_port = self._answers.bind_to_random_port(f"tcp://{self._host}")
        self.address = f"{self._host}:{pub_port}:{ask_port}"
        self._spawn(self._read(), "peer-bus-read")
        self._spawn(self._answer(), "peer-bus-answer")
        try:
            await self.announce()
        except Exception:
            log.exception("peer bus: the store could not be reached; routing alone until it can")
        if not self.picture.complete:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SNAPSHOT_WAIT_S):
                    await self._complete.wait()
        if not self.picture.complete:
            log.warning(
                "peer bus: no snapshot from %s within %.0fs; serving, routing degraded until then",
                [p for p, heard in self.picture.peers().items() if not heard],
                SNAPSHOT_WAIT_S,
            )
        self._loops = [
            PeriodicTask("peer-bus-flush", FLUSH_S, self.flush),
            PeriodicTask("peer-bus-announce", ANNOUNCE_S, self.announce),
        ]
        for loop in self._loops:
            loop.start()

    async def close(self) -> None:
        for loop in self._loops:
            await loop.stop()
        for handle in self._ask_later.values():
            handle.cancel()
        self._ask_later.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await self._store.withdraw_peer(self.name)
        self._context.destroy(linger=0)

    # -- the rounds

    async def announce(self) -> None:
        """Say where this process listens; connect to new peers, drop gone ones, and ask for a
        snapshot wherever the picture lacks one."""
        found = dict(await self._store.announce_peer(self.name, self.address, 3 * ANNOUNCE_S))
        now = self._clock()
        for peer, address in found.items():
            if self._connected.get(peer) != address:
                if peer in self._connected:
                    self._sub.disconnect(_pub_endpoint(self._connected[peer]))
                self._sub.connect(_pub_endpoint(address))
                self._connected[peer] = address
                self.picture.met(peer, now)
        for peer in [p for p in self._connected if p not in found]:
            self._sub.disconnect(_pub_endpoint(self._connected.pop(peer)))
            self.picture.left(peer)
            self._asked.pop(peer, None)
        self.picture.expire(now)
        for peer, heard in self.picture.peers().items():
            if not heard and peer in self._connected:
                self._ask(peer)

    async def flush(self) -> None:
        """Send what the outbox gathered, and the loads when they changed or are due."""
        overflowed = self.outbox.overflowed  # before `take`, which clears it
        items = self.outbox.take() if len(self.outbox) else []
        now = self._clock()
        loads = dict(self._in_flight())
        if loads != self._loads_sent or now - self._loads_at >= HEARTBEAT_S:
            items.append(["l", loads])
            self._loads_sent, self._loads_at = loads, now
        if not items:
            return
        # Items were dropped: a skipped number makes every peer ask for a snapshot.
        self._seq += 2 if overflowed else 1
        await self._pub.send(seal(self._key, ["batch", self.name, self._seq, items]))
        self.sent_batches += 1

    # -- reading

    async def _read(self) -> None:
        while True:
            frame = await self._sub.recv()
            try:
                body = unseal(self._key, frame)
                kind, peer, seq, items = body
                if kind != "batch" or not isinstance(items, list):
                    raise BadFrame("not a batch")
            except (BadFrame, ValueError, TypeError):
                self.refused += 1
                continue
            if not self.picture.batch(str(peer), int(seq), items, self._clock()):
                self._ask(str(peer))

    def _ask(self, peer: str) -> None:
        if peer not in self._connected or peer in self._ask_later:
            return
        now = self._clock()
        wait = self._asked.get(peer, -ASK_AGAIN_S) + ASK_AGAIN_S - now
        if wait > 0:
            # Put off, not dropped: a gap seen just after a snapshot (a batch published before
            # this process's subscription reached the peer) would otherwise wait for the next
            # announce, which start() does not run while it waits for the snapshots.
            handle = asyncio.get_running_loop().call_later(wait, self._ask_put_off, peer)
            self._ask_later[peer] = handle
            return
        self._asked[peer] = now
        self._spawn(self._take_snapshot(peer), f"peer-ask-{peer}")

    def _ask_put_off(self, peer: str) -> None:
        del self._ask_later[peer]
        if not self.picture.peers().get(peer, True):  # still known and still not heard
            self._ask(peer)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _take_snapshot(self, peer: str) -> None:
        """Ask the peer for its snapshot, whole record included: every peer's record holds
        what all the others told it, so merging them loses nothing and costs a few MB once."""
        address = self._connected.get(peer)
        if address is None:
            return
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        nonce = secrets.token_hex(8)
        try:
            dealer.connect(_ask_endpoint(address))
            await dealer.send(seal(self._key, ["ask", self.name, nonce, True]))
            async with asyncio.timeout(SNAPSHOT_WAIT_S):
                while True:
                    try:
                        kind, sender, answered, found = unseal(self._key, await dealer.recv())
                    except (BadFrame, ValueError):
                        self.refused += 1
                        continue
                    if kind == "snapshot" and sender == peer and answered == nonce:
                        break
            if await self.picture.snapshot_of(peer, found, self._clock()):
                log.info("peer bus: took %s's snapshot", peer)
                if self.picture.complete:
                    self._complete.set()
            else:
                self._ask(peer)
        except TimeoutError:
            log.warning("peer bus: %s did not answer a snapshot request", peer)
        except BadMessage as exc:
            log.warning("peer bus: %s", exc)
        finally:
            dealer.close(linger=0)

    async def _answer(self) -> None:
        while True:
            frames = await self._answers.recv_multipart()
            if len(frames) != 2:
                self.refused += 1
                continue
            identity, frame = frames
            try:
                kind, _, nonce, want_index = unseal(self._key, frame)
                if kind != "ask":
                    raise BadFrame("not a request")
            except (BadFrame, ValueError):
                self.refused += 1
                continue
            # Anything still in the outbox goes out first: the snapshot's `seq` then covers
            # every request it shows, and the batches after it carry only what came later.
            await self.flush()
            found: Any = await snapshot(
                self.picture.router,
                self._seq,
                dict(self._in_flight()),
                self._clock(),
                index=bool(want_index),
            )
            await self._answers.send_multipart(
                [identity, seal(self._key, ["snapshot", self.name, nonce, found])]
            )


def attach(router: Router, outbox: PeerOutbox, picture: SharedPicture) -> None:
    """Wire the router's hooks: what this gateway does is told to the outbox, and the loads it
    reads count what the picture says the others have in flight."""
    router.outbox = outbox
    router.kv.pressure.listener = outbox
    router.slots.listener = outbox
    router.breaker.listener = outbox.breaker_changed
    router.loads.peers = picture


def _pub_endpoint(address: str) -> str:
    host, pub_port, _ = address.rsplit(":", 2)
    return f"tcp://{host}:{pub_port}"


def _ask_endpoint(address: str) -> str:
    host, _, ask_port = address.rsplit(":", 2)
    return f"tcp://{host}:{ask_port}"
