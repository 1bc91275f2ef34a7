"""Background loops owned by the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class PeriodicTask:
    """Runs `step` every `interval_s` until stopped. A failing step never ends the loop; it is
    logged when the failures start and when they stop, not on every round of an outage."""

    def __init__(self, name: str, interval_s: float, step: Callable[[], Awaitable[object]]) -> None:
        self._name = name
        self._interval_s = interval_s
        self._step = step
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._stopping = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            # The flag as well as the cancel: a step that swallows a cancellation (some library
            # code does) must still let the loop end at its next turn.
            self._stopping = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._interval_s)
            if self._stopping:
                return
            try:
                await self._step()
            except Exception:
                if not self._failing:
                    log.exception("%s failed; retrying every %.1fs", self._name, self._interval_s)
                self._failing = True
                continue
            if self._failing:
                log.info("%s recovered", self._name)
            self._failing = False
