"""The agent's subscriber to one vLLM replica's KV-cache events (issue 13, first part).

vLLM's PUB socket connects to the endpoint it is given when that endpoint names an address
rather than a wildcard (engines/vllm.py gives it 127.0.0.1), so the subscriber binds
there and the engine connects; its replay ROUTER binds the replay endpoint, which the
subscriber's DEALER asks for missed batches. Each message is decoded (engines/kv_events.py,
msgpack only), placed in the publisher's sequence (engines/kv_sequence.py) and handed on to a
sink in order: a gap is filled from the replay socket before the batch that revealed it, and a
publisher that restarted, a gap the engine can no longer replay or an event of an unknown kind
resets the sink's view of that replica rather than leave it wrong.

The agent runs one per local replica whose engine publishes (kv_subscriptions.py), all into its
KvHub (kv_hub.py), which carries the changes on to the gateways' KV feed. Both endpoints are
on loopback (engines/vllm.py's kv_events_config): nothing beyond the node reaches them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio

from engines.kv_events import (
    Event,
    EventBatch,
    MalformedEvent,
    UnknownEvent,
    decode_message,
    decode_payload,
    decode_seq,
)
from engines.kv_sequence import SequenceTracker, Verdict

# The end of a replay: a sequence frame of all ones.
REPLAY_END = b"\xff" * 8
REPLAY_TIMEOUT_S = 2.0


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


class KvSubscriber:
    def __init__(
        self,
        replica_id: str,
        endpoint: str,
        replay_endpoint: str,
        topic: str,
        sink: KvSink,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.counters = KvCounters()
        self._endpoint = endpoint
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._sink = sink
        self._context = context or zmq.asyncio.Context.instance()
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
        """Receive until cancelled; `bound` is set once the socket listens."""
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        try:
            sub.bind(self._endpoint)
            if bound is not None:
                bound.set()
            while True:
                self._receive(await sub.recv_multipart())
                if self._tracker.missing_from is not None:
                    await self._fill_gap()
        finally:
            sub.close()

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
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
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
