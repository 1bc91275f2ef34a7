"""Work a request starts and does not wait for (learning a chat's leading token ids from an
engine, gateway/tokenize.py), bounded: at most `limit` at once, and one more is not started
rather than queued, so a burst of requests cannot pile up work behind the engines' backs.
Cancelled when the gateway stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 8


class SideTasks:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, work: Callable[[], Coroutine[Any, Any, object]], name: str) -> bool:
        """Run `work()` unless `limit` are running (then it is not called): whether it started.
        Its failure is logged, never raised into anything."""
        if len(self._tasks) >= self.limit:
            return False
        task = asyncio.create_task(self._guarded(work(), name), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _guarded(work: Coroutine[Any, Any, object], name: str) -> None:
        try:
            await work
        except Exception:
            log.exception("%s failed", name)
