"""Entity workflows refuse a cancel request.

`temporal workflow cancel` and the web UI's Cancel are one click. For a node's workflow a
cancel used to end it as cancelled, which its agent read as "removed": it stopped every engine
and exited. A node, a model or a replica is removed by `llmgw node rm` / `llmgw model rm` (or
the documented signals and updates) and nothing else, so these workflows run their loop as a
task the cancel does not reach (the SDK cancels only the workflow's main task) and say, in the
worker's log, that they refused it. Nothing in flight is interrupted: a half-done install or
drain goes on as if no cancel had come. Terminate cannot be refused; what survives it is
described in docs/operations.md.
"""

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from temporalio import workflow

T = TypeVar("T")


async def refusing_cancel(work: Coroutine[Any, Any, T], remedy: str) -> T:
    """`work`'s result, however many cancel requests arrive meanwhile. `remedy`: how to end
    this workflow for real, for the log line."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise  # the work itself was cancelled: nothing of ours to refuse
            workflow.logger.warning(
                "%s: cancel request refused (%s)", workflow.info().workflow_id, remedy
            )
