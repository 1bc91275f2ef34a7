"""A stand-in vLLM KV-event publisher on real ZMQ sockets, for the subscribers' tests: what vLLM
does, its replay ROUTER bound and its PUB connected to the agent's subscriber's endpoint or, as
an external engine started with a wildcard endpoint, bound for the gateway to connect to."""

import asyncio
from collections.abc import Callable

import msgpack
import zmq
import zmq.asyncio

from kv.subscriber import REPLAY_END, KvSubscriber

TOPIC = "kv@m"


class StandinPublisher:
    """PUB connected to the subscriber (or bound, `bind=True`), a ROUTER bound for replays, and
    a buffer of what it sent (sequence numbers from whatever the test publishes, as after a
    restart or not)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        replay: str,
        new: bool = True,
        topic: str = TOPIC,
        bind: bool = False,
    ) -> None:
        self.topic = topic
        self.router = ctx.socket(zmq.ROUTER)
        try:
            self.router.bind(replay)
        except zmq.ZMQError:
            self.router.close(0)  # left open, it would hang the context's term()
            raise
        self.pub = ctx.socket(zmq.PUB)
        if bind:
            try:
                self.pub.bind(endpoint)
            except zmq.ZMQError:
                self.pub.close(0)
                self.router.close(0)
                raise
        else:
            self.pub.connect(endpoint)
        self.buffer: dict[int, bytes] = {}
        self.new_replay_format = new
        self.serving = asyncio.ensure_future(self._serve_replays())

    def payload(self, seq: int, blocks: list[int]) -> bytes:
        stored = {"type": "BlockStored", "block_hashes": blocks, "token_ids": [1], "block_size": 1}
        packed: bytes = msgpack.packb([float(seq), [stored], 0])
        return packed

    async def publish(self, seq: int, block: int | list[int], send: bool = True) -> None:
        self.buffer[seq] = self.payload(seq, block if isinstance(block, list) else [block])
        if send:
            await self.pub.send_multipart(
                [self.topic.encode(), seq.to_bytes(8, "big"), self.buffer[seq]]
            )

    async def _serve_replays(self) -> None:
        while True:
            identity, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq in sorted(s for s in self.buffer if s >= first):
                head = [identity, b""] + ([self.topic.encode()] if self.new_replay_format else [])
                await self.router.send_multipart([*head, seq.to_bytes(8, "big"), self.buffer[seq]])
            end = [b"", REPLAY_END, b""] if self.new_replay_format else [REPLAY_END, b""]
            await self.router.send_multipart([identity, b"", *end])

    def close(self) -> None:
        self.serving.cancel()
        self.pub.close(0)
        self.router.close(0)


async def restarted(
    ctx: zmq.asyncio.Context, endpoint: str, replay: str, bind: bool = False
) -> StandinPublisher:
    """A new publisher process on the same ports. ZMQ releases a closed socket's port in its
    own I/O thread, a moment after close(): the ports are bound as soon as they are free."""
    async with asyncio.timeout(5):
        while True:
            try:
                return StandinPublisher(ctx, endpoint, replay, bind=bind)
            except zmq.ZMQError:
                await asyncio.sleep(0.01)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for `check` to hold, failing after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def connected(
    subscriber: KvSubscriber, publisher: StandinPublisher, block: int = 1000
) -> None:
    """ZMQ drops what a PUB sends before its connection is up: publish seq 0 until heard."""
    async with asyncio.timeout(5):
        while subscriber.counters.received == 0:
            await publisher.publish(0, block)
            await asyncio.sleep(0.02)
