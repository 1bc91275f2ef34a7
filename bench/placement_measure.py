"""What `llmgw bench placement` measures on a running ledger, cell by cell: update round trips
with a fixed number in flight, query answers, a cell's history over all its runs, and how long a
new run of a cell takes to unpack the state it is handed."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel
from pydantic_core import to_json
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError

from workflows.ledger import ClusterLedgerWorkflow
from workflows.ledger_compact import PackedLedgerState, carried_state
from workflows.placement import PlacementIndex

M = TypeVar("M", bound=BaseModel)


@dataclass
class Timings:
    """Round trips of one kind of call, in seconds, and how long the phase took."""

    samples: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    refused: int = 0

    def pct(self, q: float) -> float:
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def figures(self) -> dict[str, float]:
        return {
            "count": len(self.samples),
            "refused": self.refused,
            "wall_s": round(self.wall_s, 2),
            "per_s": round(len(self.samples) / self.wall_s, 1) if self.wall_s else 0.0,
            "p50_ms": round(1000 * self.pct(0.5), 1),
            "p90_ms": round(1000 * self.pct(0.9), 1),
            "p99_ms": round(1000 * self.pct(0.99), 1),
            "max_ms": round(1000 * max(self.samples or [0.0]), 1),
        }


async def bounded(
    items: Sequence[M],
    call: Callable[[M], Awaitable[float | None]],
    concurrency: int,
    timings: Timings,
    progress: str,
) -> None:
    """Run `call` on every item with at most `concurrency` in flight."""
    queue = list(reversed(items))
    done = 0
    start = time.monotonic()

    async def lane() -> None:
        nonlocal done
        while queue:
            item = queue.pop()
            took = await call(item)
            if took is None:
                timings.refused += 1
            else:
                timings.samples.append(took)
            done += 1
            if done % max(1, len(items) // 10) == 0:
                el = time.monotonic() - start
                print(f"    {progress}: {done}/{len(items)} ({el:.0f} s)", file=sys.stderr)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    timings.wall_s = time.monotonic() - start


def json_bytes(value: object) -> int:
    """Bytes as the pydantic data converter writes them."""
    return len(to_json(value))


async def timed_query(
    handle: WorkflowHandle[ClusterLedgerWorkflow, None],
    query: Callable[[ClusterLedgerWorkflow], BaseModel],
) -> dict[str, object]:
    """One query's answer size and time, or why it failed (an answer over gRPC's 4 MB limit)."""
    t = time.perf_counter()
    try:
        answer = await handle.query(query)
    except (WorkflowQueryFailedError, RPCError) as err:
        return {"ok": False, "error": str(err), "ms": round(1000 * (time.perf_counter() - t), 1)}
    return {
        "ok": True,
        "bytes": json_bytes(answer),
        "ms": round(1000 * (time.perf_counter() - t), 1),
    }


def unpack_times(packed: PackedLedgerState) -> dict[str, float]:
    """What a new run of this cell does with the state its previous run carried, timed here
    outside any workflow (a floor: the worker's other threads, its garbage collections and a
    loaded machine add to it): the data converter reads the payload and __init__ unpacks it,
    all in the run's first activation, which the SDK fails after 2 s; the placement index is
    built by the run's first placement or offer, another activation."""
    payload = to_json(packed)
    t = time.perf_counter()
    state = carried_state(PackedLedgerState.model_validate_json(payload))
    unpack_s = time.perf_counter() - t
    t = time.perf_counter()
    PlacementIndex(state)
    return {"unpack_s": round(unpack_s, 3), "index_build_s": round(time.perf_counter() - t, 3)}


class DeadlockCounter(logging.Handler):
    """Counts the worker's log records about activations the SDK's deadlock detector failed
    (an activation over 2 s): a new ledger run unpacking its state is the usual one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {type(record.exc_info[1]).__name__} {record.exc_info[1]}"
        if "deadlock" in text.lower():
            self.count += 1


@dataclass
class RunFigures:
    run_id: str
    status: str
    events: int
    bytes: int
    started_input_bytes: int


@dataclass
class HistoryFigures:
    runs: list[RunFigures] = field(default_factory=list)
    # Across every run: events by type, and bytes of update events by update name.
    event_types: Counter[str] = field(default_factory=Counter)
    update_bytes: Counter[str] = field(default_factory=Counter)
    update_count: Counter[str] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.runs)

    def add(self, other: HistoryFigures) -> None:
        """Another cell's history into this sum."""
        self.runs += other.runs
        self.event_types.update(other.event_types)
        self.update_bytes.update(other.update_bytes)
        self.update_count.update(other.update_count)


async def history_figures(client: Client, workflow_id: str) -> HistoryFigures:
    """Every run of one ledger cell (continue-as-new makes a chain of them), newest first."""
    figures = HistoryFigures()
    run_id: str | None = None
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        described = await handle.describe()
        info = described.raw_description.workflow_execution_info
        names: dict[int, str] = {}
        events = 0
        size = 0
        previous = ""
        started_input = 0
        async for event in handle.fetch_history_events():
            events += 1
            size += event.ByteSize()
            kind = event.WhichOneof("attributes") or "?"
            figures.event_types[kind.removesuffix("_event_attributes")] += 1
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes
                previous = started.continued_execution_run_id
                started_input = sum(len(p.data) for p in started.input.payloads)
            elif event.HasField("workflow_execution_update_accepted_event_attributes"):
                accepted = event.workflow_execution_update_accepted_event_attributes
                name = accepted.accepted_request.input.name
                names[event.event_id] = name
                figures.update_bytes[name] += event.ByteSize()
                figures.update_count[name] += 1
            elif event.HasField("workflow_execution_update_completed_event_attributes"):
                completed = event.workflow_execution_update_completed_event_attributes
                figures.update_bytes[names.get(completed.accepted_event_id, "?")] += (
                    event.ByteSize()
                )
        figures.runs.append(
            RunFigures(
                run_id=described.run_id,
                status=described.status.name if described.status else "?",
                events=events,
                bytes=info.history_size_bytes or size,
                started_input_bytes=started_input,
            )
        )
        if not previous:
            return figures
        run_id = previous
