"""The handler's watch on its client under an ASGI server other than the gateway's own (which
tells the watch from the connection itself: tests/unit/test_gateway_proxy.py, "a client that
leaves"): it waits for the next ASGI message, which after the body is the disconnect."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.relay import ClientWatch


class Channel:
    """An ASGI `receive` whose next message the test sends."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        return await self.messages.get()


async def handler(channel: Channel, finish: bool) -> ClientWatch:
    watch = ClientWatch(channel.receive)
    try:
        if finish:
            watch.finished = True
        await asyncio.sleep(10)
        return watch
    except asyncio.CancelledError:
        if not watch.gone:
            raise  # cancelled by the test, not by the watch
        return watch
    finally:
        watch.stop()


async def test_a_disconnect_cancels_the_handler() -> None:
    channel = Channel()
    task = asyncio.create_task(handler(channel, finish=False))
    await asyncio.sleep(0.01)
    channel.messages.put_nowait({"type": "http.disconnect"})
    watch = await asyncio.wait_for(task, 2)
    assert watch.gone


async def test_a_disconnect_after_the_response_finished_cancels_nothing() -> None:
    channel = Channel()
    task = asyncio.create_task(handler(channel, finish=True))
    await asyncio.sleep(0.01)
    channel.messages.put_nowait({"type": "http.disconnect"})
    await asyncio.sleep(0.05)
    assert not task.done(), "a finished response's disconnect is no client leaving"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
