"""The agent's KV-event subscriber against a stand-in vLLM publisher on real ZMQ sockets: the
engine's PUB connects to the subscriber, its replay ROUTER answers from a buffer."""

import asyncio
from collections.abc import AsyncIterator

import msgpack
import pytest
import zmq.asyncio

from kv.events import Event
from kv.index import KvBlockIndex
from kv.subscriber import KvSubscriber
from tests.ports import free_port
from tests.unit.kv_publisher_standin import TOPIC, StandinPublisher, connected, until


class IndexSink:
    def __init__(self) -> None:
        self.index = KvBlockIndex()
        self.resets = 0

    def apply(self, replica_id: str, events: list[Event]) -> None:
        for event in events:
            self.index.apply(replica_id, event)

    def reset(self, replica_id: str) -> None:
        self.resets += 1
        self.index.reset(replica_id)


# vLLM >= 0.26 puts the topic in replayed frames; older versions do not.
@pytest.fixture(params=[True, False], ids=["replay-0.26", "replay-0.25"])
async def wired(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[KvSubscriber, IndexSink, StandinPublisher]]:
    ctx = zmq.asyncio.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    sink = IndexSink()
    subscriber = KvSubscriber("m-0", endpoint, replay, TOPIC, sink, context=ctx)
    bound = asyncio.Event()
    task = asyncio.ensure_future(subscriber.run(bound))
    await bound.wait()
    publisher = StandinPublisher(ctx, endpoint, replay, new=request.param)
    try:
        yield subscriber, sink, publisher
    finally:
        task.cancel()
        publisher.close()
        await asyncio.gather(task, return_exceptions=True)
        ctx.term()


async def test_blocks_arrive_in_order_and_a_gap_is_filled_before_the_batch_that_showed_it(
    wired: tuple[KvSubscriber, IndexSink, StandinPublisher],
) -> None:
    subscriber, sink, publisher = wired
    await connected(subscriber, publisher)
    await publisher.publish(1, 1001)
    await publisher.publish(2, 1002, send=False)  # lost on the wire
    await publisher.publish(3, 1003, send=False)
    await publisher.publish(4, 1004)
    await until(lambda: sink.index.size("m-0") == 5)
    held = sink.index.leading_blocks([1000, 1001, 1002, 1003, 1004], ["m-0"])
    assert held == {"m-0": 5}
    assert subscriber.counters.gaps == 1
    assert subscriber.counters.replays == 1


async def test_a_gap_the_engine_can_no_longer_replay_starts_the_replica_over(
    wired: tuple[KvSubscriber, IndexSink, StandinPublisher],
) -> None:
    subscriber, sink, publisher = wired
    await connected(subscriber, publisher)
    resets = sink.resets
    await publisher.publish(1, 1001)
    await until(lambda: sink.index.size("m-0") == 2)
    del publisher.buffer[0], publisher.buffer[1]
    await publisher.publish(5, 1005)  # 2..4 never existed in the buffer either
    await until(lambda: sink.resets == resets + 1)
    await until(lambda: sink.index.size("m-0") == 1)
    # What was held before the loss is forgotten; the batch after it is kept.
    assert sink.index.leading_blocks([1005], ["m-0"]) == {"m-0": 1}
    assert sink.index.leading_blocks([1000], ["m-0"]) == {"m-0": 0}


async def test_a_restarted_publisher_and_bad_frames_reset_or_drop_never_crash(
    wired: tuple[KvSubscriber, IndexSink, StandinPublisher],
) -> None:
    subscriber, sink, publisher = wired
    await connected(subscriber, publisher)
    await publisher.publish(1, 1001)
    await until(lambda: sink.index.size("m-0") == 2)
    topic = TOPIC.encode()
    await publisher.pub.send_multipart([topic, b"\x00" * 8, b"\x80\x04pickle"])
    await publisher.pub.send_multipart([topic, b"short"])
    unknown = msgpack.packb([0.0, [{"type": "BlockMoved"}], 0])
    await publisher.pub.send_multipart([topic, (2).to_bytes(8, "big"), unknown])
    await until(lambda: subscriber.counters.unknown == 1)
    assert subscriber.counters.malformed == 2
    assert sink.index.size("m-0") == 0  # an event it cannot apply: nothing is trusted
    # The engine restarts: its sequence begins at 0 again.
    await publisher.publish(0, 2000)
    await until(lambda: sink.index.size("m-0") == 1)
    assert sink.index.leading_blocks([2000], ["m-0"]) == {"m-0": 1}
