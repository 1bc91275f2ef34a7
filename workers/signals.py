"""One way for every process to stop on Ctrl-C or SIGTERM: an event the main task awaits."""

import asyncio
import contextlib
import signal


def stop_event() -> asyncio.Event:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, event.set)
    return event


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep for `seconds`, waking early when the process is told to stop."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
