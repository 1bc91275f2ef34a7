"""A subscriber to one vLLM engine's KV-cache events (issue 13), for the node agent and the
gateway alike.

Two ways to meet the engine's PUB socket. The node agent's own vLLM replicas are given a plain
loopback endpoint (engines/vllm.py), to which vLLM's PUB connects, so the agent's subscriber
binds there and the engine connects (`connect=False`). An external vLLM (a fleet llmgw does not
run) is started by its operator with a wildcard endpoint (tcp://*:PORT), so its PUB binds, and
the gateway's subscriber connects to it (`connect=True`). Either way the engine's replay ROUTER
binds the replay endpoint, which the subscriber's DEALER asks for missed batches.

Each message is decoded (kv/events.py, msgpack only), placed in the publisher's
sequence (kv/sequence.py) and handed on to a sink in order: a gap is filled from the
replay socket before the batch that revealed it, and a publisher that restarted, a gap the
engine can no longer replay (or no replay endpoint to ask) or an event of an unknown kind resets
the sink's view of that replica rather than leave it wrong.

A connecting subscriber also watches its connection (a ZMQ socket monitor). ZMQ reconnects by
itself and hides the outage, and batches published meanwhile are lost, so a connection that
drops resets the replica and starts its sequence afresh: what comes after the reconnection
rebuilds the view from nothing. A peer that goes silent without closing the connection (a
frozen host, a cut cable) is found by ZMTP heartbeats: the subscriber pings every `heartbeat_s`
and drops the connection when nothing comes back within `silence_s`. vLLM's libzmq answers the
pings itself; vLLM itself sends nothing while idle, and an idle engine's blocks stay known.

The agent runs one per local replica whose engine publishes (activities/agent/
kv/subscriptions.py), into its KvHub; the gateway one per external engine's publisher
(gateway/kv/publishers.py), into its KvBlockIndex."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from kv.events import (
    MAX_PAYLOAD_BYTES,
    Event,
    EventBatch,
    MalformedEvent,
    UnknownEvent,
    decode_message,
    decode_payload,
    decode_seq,
)
from kv.sequence import SequenceTracker, Verdict

# The end of a replay: a sequence frame of all ones.
REPLAY_END = b"\xff" * 8
REPLAY_TIMEOUT_S = 2.0
# A connecting subscriber (see the module's docstring): how often it pings the publisher, how
# long it waits for any answer before it drops the connection, and how far apart ZMQ's
# reconnection attempts grow.
HEARTBEAT_S = 5.0
SILENCE_S = 15.0
RECONNECT_MAX_S = 5.0
# A frame larger than the decoder takes ends the connection (ZMQ's MAXMSGSIZE) before it is
# buffered whole: a peer on the network must not make the gateway hold without bound.
MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES
_MONITORED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class KvSink(Protocol):
    """Where a replica's events go, in the engine's order."""

    def apply(self, replica_id: str, events: list[Event]) -> None: ...

    def reset(self, replica_id: str) -> None: ...


@dataclass
class KvCounters:
    received: int = 0
    malformed: int = 0
    duplicates: int = 0
    unknown: int = 0
    gaps: int = 0
    replays: int = 0
    resets: int = 0
    # A connecting subscriber only: connections made (handshakes done) and lost.
    connects: int = 0
    disconnects: int = 0


class KvSubscriber:
    def __init__(
        self,
        replica_id: str,
        endpoint: str,
        replay_endpoint: str,
        topic: str,
        sink: KvSink,
        context: zmq.asyncio.Context | None = None,
        *,
        connect: bool = False,
        counters: KvCounters | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        silence_s: float = SILENCE_S,
    ) -> None:
        """`replay_endpoint` "": no replay socket, so a gap resets the replica. `connect`:
        connect to a publisher that binds `endpoint` rather than bind it (the module's
        docstring)."""
        self.replica_id = replica_id
        self.counters = counters if counters is not None else KvCounters()
        # A connecting subscriber: whether its connection is up now.
        self.connected = False
        self._endpoint = endpoint
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._sink = sink
        self._context = context or zmq.asyncio.Context.instance()
        self._connect = connect
        self._heartbeat_s = heartbeat_s
        self._silence_s = silence_s
        self._tracker = SequenceTracker()
        # The batch that revealed a gap, applied once the gap is filled or given up.
        self._held: EventBatch | None = None

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def last_seq(self) -> int | None:
        """The engine's sequence number of the newest batch heard (duplicates aside); None
        before the first."""
        expected = self._tracker.expected
        return None if expected is None else expected - 1

    async def run(self, bound: asyncio.Event | None = None) -> None:
        """Receive until cancelled; `bound` is set once the socket listens (or, connecting,
        once it is told where to connect)."""
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        monitor: zmq.asyncio.Socket | None = None
        try:
            poller = zmq.asyncio.Poller()
            if self._connect:
                monitor = self._dial(sub)
                poller.register(monitor, zmq.POLLIN)
            else:
                sub.bind(self._endpoint)
            poller.register(sub, zmq.POLLIN)
            if bound is not None:
                bound.set()
            while True:
                ready = dict(await poller.poll())
                if monitor is not None and monitor in ready:
                    self._watch(await monitor.recv_multipart())
                if sub in ready:
                    self._receive(await sub.recv_multipart())
                    if self._tracker.missing_from is not None:
                        await self._fill_gap()
        finally:
            self.connected = False
            if monitor is not None:
                sub.disable_monitor()
                monitor.close()
            sub.close()

    def _dial(self, sub: zmq.asyncio.Socket) -> zmq.asyncio.Socket:
        """Connect `sub` to the publisher; the socket that reports the connection's events."""
        sub.setsockopt(zmq.HEARTBEAT_IVL, int(self._heartbeat_s * 1000))
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(self._silence_s * 1000))
        # A publisher that accepts the TCP connection but never greets is dropped as well.
        sub.setsockopt(zmq.HANDSHAKE_IVL, int(self._silence_s * 1000))
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_MAX_S * 1000))
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        monitor = sub.get_monitor_socket(_MONITORED)
        sub.connect(self._endpoint)
        return monitor

    def _watch(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connected = True
            self.counters.connects += 1
        elif event == zmq.EVENT_DISCONNECTED and self.connected:
            # What was published while the connection was down is lost, and the publisher
            # may have restarted meanwhile: the next batch heard starts the replica afresh.
            self.connected = False
            self.counters.disconnects += 1
            self._tracker = SequenceTracker()
            self._held = None
            self._reset()

    def _receive(self, frames: list[bytes]) -> None:
        try:
            batch = decode_message(frames)
        except MalformedEvent:
            self.counters.malformed += 1
            return
        self.counters.received += 1
        verdict = self._tracker.see(batch.seq)
        if verdict is Verdict.DUPLICATE:
            self.counters.duplicates += 1
        elif verdict is Verdict.RESTART:
            self._reset()
            self._hand_on(batch)
        elif verdict is Verdict.GAP:
            self.counters.gaps += 1
            self._held = batch
        else:
            self._hand_on(batch)

    async def _fill_gap(self) -> None:
        start = self._tracker.missing_from
        assert start is not None
        self.counters.replays += 1
        replayed = await self._replay(start)
        first = replayed[0].seq if replayed else None
        if first is not None and self._tracker.replayed_from(first):
            for batch in replayed:
                if self._tracker.missed(batch.seq):
                    self._hand_on(batch)
        else:
            # The engine's buffer no longer holds what was missed: start that replica over.
            self._reset()
        self._tracker.gap_closed()
        if self._held is not None:
            self._hand_on(self._held)
            self._held = None

    async def _replay(self, start: int) -> list[EventBatch]:
        """The batches the replay socket still holds from `start` on; [] when it does not
        answer in time or answers with something that is not a replay."""
        if not self._replay_endpoint:
            return []
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        batches: list[EventBatch] = []
        try:
            dealer.connect(self._replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                while True:
                    frames = await dealer.recv_multipart()
                    batch = _replayed(frames, self._topic)
                    if batch is None:
                        return batches
                    batches.append(batch)
        except TimeoutError:
            return []
        except MalformedEvent:
            self.counters.malformed += 1
            return []
        finally:
            dealer.close()

    def _hand_on(self, batch: EventBatch) -> None:
        if any(isinstance(e, UnknownEvent) for e in batch.events):
            # An event this code cannot apply: what the replica holds is no longer known.
            self.counters.unknown += 1
            self._reset()
            return
        if batch.events:
            self._sink.apply(self.replica_id, batch.events)

    def _reset(self) -> None:
        self.counters.resets += 1
        self._sink.reset(self.replica_id)


def _replayed(frames: list[bytes], topic: bytes) -> EventBatch | None:
    """One replayed batch, or None at the end marker. vLLM <= 0.25 answers [b"", seq,
    payload] and ends with [b"", 0xff*8, b""]; >= 0.26 answers [b"", topic, seq, payload]
    and ends with [b"", b"", 0xff*8, b""]."""
    if not frames or frames[0] != b"":
        raise MalformedEvent("a replay frame set starts with an empty frame")
    rest = frames[1:]
    if len(rest) == 3 and rest[1] != REPLAY_END:
        topic, seq, payload = rest
    elif len(rest) == 2 and rest[0] != REPLAY_END:
        seq, payload = rest
    elif REPLAY_END in rest:
        return None
    else:
        raise MalformedEvent(f"a replay answer of {len(frames)} frames")
    return decode_payload(topic, decode_seq(seq), payload)
