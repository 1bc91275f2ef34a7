"""`llmgw bench placement` (or `python -m bench.placement`): the ledger at fleet scale.

A command, not a test: it starts an embedded Temporal dev server (SQLite file, headless) in a
temporary directory and a control worker in this process, registers simulated nodes through
the ledger's `upsert_node` update, places replicas through `place` and publishes each one's
route through `set_route`, as node and replica workflows do (update-with-start, the way
activities/control/ledger_calls.py sends them). Then it prints placement latency, the ledger's state
size against Temporal's 2 MB payload limit, and how its history grows.

Only the ledger workflow runs: no node agent, no replica workflow, no engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import to_json
from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.control.ledger_calls import ledger_handle, update_ledger
from activities.control.ledger_cluster import LedgerActivities, allocate
from bench.dev_server import scratch_dev_server
from bench.placement_table import paged_table
from bench.simulated_fleet import GPUS_PER_NODE, replica_mix, route_for, simulated_node
from workflows.client import connect
from workflows.contracts import (
    Allocation,
    NodeRecord,
    PlacementRequest,
    Route,
)
from workflows.ledger import NO_PLACEMENT, ClusterLedgerWorkflow
from workflows.ledger_compact import unpack_state
from workflows.names import CONTROL_TASK_QUEUE, LEDGER_WORKFLOW_ID

# Temporal refuses a payload over 2 MB (the dev server's default blob size limit) and warns
# from 256 KB; the ledger carries its whole state through continue-as-new as one payload.
PAYLOAD_LIMIT = 2 * 1024 * 1024
PAYLOAD_WARN = 256 * 1024
M = TypeVar("M", bound=BaseModel)


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Timings:
    """Round trips of one kind of update, in seconds, and how long the phase took."""

    samples: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    refused: int = 0

    def pct(self, q: float) -> float:
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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


@dataclass
class RunFigures:
    run_id: str
    status: str
    events: int
    bytes: int
    started_input_bytes: int


@dataclass
class HistoryFigures:
    runs: list[RunFigures]
    # Across every run: events by type, and bytes of update events by update name.
    event_types: Counter[str]
    update_bytes: Counter[str]
    update_count: Counter[str]

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.runs)


async def history_figures(client: Client) -> HistoryFigures:
    """Every run of the ledger (continue-as-new makes a chain of them), newest first."""
    runs: list[RunFigures] = []
    types: Counter[str] = Counter()
    update_bytes: Counter[str] = Counter()
    update_count: Counter[str] = Counter()
    run_id: str | None = None
    while True:
        handle = client.get_workflow_handle(LEDGER_WORKFLOW_ID, run_id=run_id)
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
            types[kind.removesuffix("_event_attributes")] += 1
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes
                previous = started.continued_execution_run_id
                started_input = sum(len(p.data) for p in started.input.payloads)
            elif event.HasField("workflow_execution_update_accepted_event_attributes"):
                accepted = event.workflow_execution_update_accepted_event_attributes
                name = accepted.accepted_request.input.name
                names[event.event_id] = name
                update_bytes[name] += event.ByteSize()
                update_count[name] += 1
            elif event.HasField("workflow_execution_update_completed_event_attributes"):
                completed = event.workflow_execution_update_completed_event_attributes
                update_bytes[names.get(completed.accepted_event_id, "?")] += event.ByteSize()
        runs.append(
            RunFigures(
                run_id=described.run_id,
                status=described.status.name if described.status else "?",
                events=events,
                bytes=info.history_size_bytes or size,
                started_input_bytes=started_input,
            )
        )
        if not previous:
            return HistoryFigures(runs, types, update_bytes, update_count)
        run_id = previous


# --- the benchmark ------------------------------------------------------------------------


@dataclass
class Options:
    nodes: int = 1000
    replicas: int = 4000
    concurrency: int = 8
    seed: int = 1
    keep: bool = False
    churn_per_hour: float = 0.10
    json_out: Path | None = None


async def bench(options: Options, address: str) -> dict[str, Any]:
    rng = random.Random(options.seed)
    client = await connect(address)
    worker = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        # The ledger alone: nothing else runs here, and the other workflows need node agents.
        workflows=[ClusterLedgerWorkflow],
        activities=LedgerActivities(client).all(),
    )
    async with worker:
        print(f"registering {options.nodes} nodes ...", file=sys.stderr)
        records = [simulated_node(i, rng) for i in range(options.nodes)]

        async def upsert(record: NodeRecord) -> float:
            t = time.perf_counter()
            await update_ledger(client, ClusterLedgerWorkflow.upsert_node, record)
            return time.perf_counter() - t

        upserts = Timings()
        await bounded(records, upsert, options.concurrency, upserts, "upsert_node")

        print(f"placing {options.replicas} replicas ...", file=sys.stderr)
        replicas = replica_mix(options.replicas, rng)
        shapes = {r.request.replica_id: r.shape for r in replicas}
        allocations: dict[str, Allocation] = {}
        refused_by_shape: Counter[str] = Counter()

        async def place(req: PlacementRequest) -> float | None:
            t = time.perf_counter()
            try:
                alloc = await allocate(client, req)
            except ApplicationError as err:
                if err.type != NO_PLACEMENT:
                    raise
                refused_by_shape[shapes[req.replica_id]] += 1
                return None
            took = time.perf_counter() - t
            allocations[req.replica_id] = alloc
            return took

        places = Timings()
        await bounded([r.request for r in replicas], place, options.concurrency, places, "place")

        requests = {r.request.replica_id: r.request for r in replicas}
        routes = [route_for(a, requests[a.replica_id]) for a in allocations.values()]

        async def set_route(route: Route) -> float:
            t = time.perf_counter()
            await update_ledger(client, ClusterLedgerWorkflow.set_route, route)
            return time.perf_counter() - t

        route_timings = Timings()
        await bounded(routes, set_route, options.concurrency, route_timings, "set_route")

        print("reading the ledger's state and history ...", file=sys.stderr)
        handle = ledger_handle(client)
        t = time.perf_counter()
        packed = await handle.query(ClusterLedgerWorkflow.packed_snapshot)
        packed_ms = 1000 * (time.perf_counter() - t)
        state = unpack_state(packed)
        plain = await timed_query(handle, ClusterLedgerWorkflow.snapshot)
        table = await timed_query(handle, ClusterLedgerWorkflow.routing_table)
        paged = await paged_table(handle)
        history = await history_figures(client)

    updates = sum(history.update_count.values())
    mean_bytes = {
        name: history.update_bytes[name] / count for name, count in history.update_count.items()
    }
    # What every update costs beyond its own two events: workflow task events.
    overhead = (history.bytes - sum(history.update_bytes.values())) / max(1, updates)
    events_per_update = history.events / max(1, updates)
    # History growth, two ways. Flat out: updates arriving for an hour at the rate measured here
    # (placing and routing a whole fleet without pause). Steady state: a share of the replicas
    # replaced each hour (autoscaling, rolling updates, lost nodes), each replacement being a
    # replica's six ledger updates: place, set_route starting/loading/ready, set_route stopping,
    # release (release costs about what set_route does).
    busy_s = places.wall_s + route_timings.wall_s
    rate = (len(places.samples) + places.refused + len(route_timings.samples)) / max(busy_s, 1e-9)
    churn_replicas_h = options.churn_per_hour * len(allocations)
    churn_bytes_h = churn_replicas_h * (
        mean_bytes.get("place", 0.0) + 5 * mean_bytes.get("set_route", 0.0) + 6 * overhead
    )
    latency = {
        name: {
            "count": len(t.samples),
            "refused": t.refused,
            "wall_s": round(t.wall_s, 2),
            "per_s": round(len(t.samples) / t.wall_s, 1) if t.wall_s else 0.0,
            "p50_ms": round(1000 * t.pct(0.5), 1),
            "p90_ms": round(1000 * t.pct(0.9), 1),
            "p99_ms": round(1000 * t.pct(0.99), 1),
            "max_ms": round(1000 * max(t.samples or [0.0]), 1),
        }
        for name, t in (("upsert_node", upserts), ("place", places), ("set_route", route_timings))
    }
    figures: dict[str, object] = {
        "nodes": options.nodes,
        "gpus": options.nodes * GPUS_PER_NODE,
        "replicas": options.replicas,
        "concurrency": options.concurrency,
        "placed": len(allocations),
        "refused_by_shape": dict(refused_by_shape),
        "gpus_allocated": sum(len(s.gpus) for a in state.allocations.values() for s in a.shards),
        "latency": latency,
        "state": {
            "plain_json_bytes": json_bytes(state),
            "nodes_bytes": json_bytes(state.nodes),
            "allocations_bytes": json_bytes(state.allocations),
            "routes_bytes": json_bytes(state.routes),
            "node_bytes_in_ledger": json_bytes(state.nodes) // max(1, len(state.nodes)),
            "node_bytes_as_discovered": json_bytes(records[0]) if records else 0,
            "packed_payload_bytes": json_bytes(packed),
            "packed_snapshot_query_ms": round(packed_ms, 1),
            "snapshot_query": plain,
            "routing_table_query": table,
            "routing_table_paged": paged,
        },
        "history": {
            "runs": [r.__dict__ for r in reversed(history.runs)],
            "continue_as_new": len(history.runs) - 1,
            "events": history.events,
            "bytes": history.bytes,
            "updates": dict(history.update_count),
            "bytes_per_update": {k: round(v) for k, v in mean_bytes.items()},
            "overhead_bytes_per_update": round(overhead),
            "events_per_update": round(events_per_update, 2),
            "event_types": dict(history.event_types),
            "flat_out_updates_per_hour": round(rate * 3600),
            "flat_out_events_per_hour": round(rate * 3600 * events_per_update),
            "flat_out_bytes_per_hour": round(rate * 3600 * history.bytes / max(1, updates)),
            "churn_per_hour": options.churn_per_hour,
            "churn_updates_per_hour": round(churn_replicas_h * 6),
            "churn_events_per_hour": round(churn_replicas_h * 6 * events_per_update),
            "churn_bytes_per_hour": round(churn_bytes_h),
        },
    }
    return figures


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


def _size(n: object) -> str:
    assert isinstance(n, int | float)
    return f"{n / 1024:,.1f} KB" if n < 1024 * 1024 else f"{n / 1024 / 1024:,.2f} MB"


def _query_line(name: str, q: object) -> str:
    assert isinstance(q, dict)
    if q["ok"]:
        return f"  {name} query: {_size(q['bytes'])} in {q['ms']:.0f} ms"
    return f"  {name} query: FAILED after {q['ms']:.0f} ms ({q['error']})"


def report(f: dict[str, Any]) -> None:
    st, h = f["state"], f["history"]
    print()
    print(
        f"ledger at scale: {f['nodes']} nodes x {GPUS_PER_NODE} GPUs, {f['replicas']} replicas, "
        f"{f['concurrency']} updates in flight"
    )
    refused = sum(f["refused_by_shape"].values())
    print(
        f"placed {f['placed']} replicas on {f['gpus_allocated']} of {f['gpus']} GPUs, "
        f"refused {refused}" + (f" {f['refused_by_shape']}" if refused else "")
    )
    print(
        "update round trips (update-with-start, as activities/control/ledger_calls.py sends them):"
    )
    for name, t in f["latency"].items():
        print(
            f"  {name:<12} {t['count']:>6} in {t['wall_s']:7.1f} s ({t['per_s']:6.1f}/s)   ms: "
            f"p50 {t['p50_ms']:6.1f}  p90 {t['p90_ms']:6.1f}  p99 {t['p99_ms']:6.1f}  "
            f"max {t['max_ms']:7.1f}"
        )
    packed = st["packed_payload_bytes"]
    verdict = "under" if packed < PAYLOAD_LIMIT else "OVER"
    print("ledger state:")
    print(
        f"  as plain JSON {_size(st['plain_json_bytes'])}: nodes {_size(st['nodes_bytes'])} "
        f"({st['node_bytes_in_ledger']:,} B a node, {st['node_bytes_as_discovered']:,} B as "
        f"discovered), allocations {_size(st['allocations_bytes'])}, routes "
        f"{_size(st['routes_bytes'])}"
    )
    print(
        f"  carried through continue-as-new, packed: {_size(packed)}, {verdict} the 2 MB payload "
        f"limit ({PAYLOAD_LIMIT / packed:.1f}x headroom; the SDK warns from 512 KB)"
    )
    print(f"  packed_snapshot query: {st['packed_snapshot_query_ms']:.0f} ms")
    print(_query_line("snapshot (plain)", st["snapshot_query"]))
    print(
        _query_line(
            "routing_table (whole, as a gateway from before deltas asks)", st["routing_table_query"]
        )
    )
    pg = st["routing_table_paged"]
    print(
        f"  routing_table as a gateway reads it: {pg['routes']:,} routes in {pg['pages']} pages, "
        f"largest {_size(pg['largest_page_bytes'])}, {_size(pg['total_bytes'])} in all, "
        f"{pg['ms']:.0f} ms; then a poll with nothing changed: {pg['poll_answer_bytes']} B"
    )
    print("ledger history:")
    print(
        f"  {len(h['runs'])} runs ({h['continue_as_new']} continue-as-new), "
        f"{h['events']:,} events, {_size(h['bytes'])}; "
        f"{h['events_per_update']:.2f} events an update"
    )
    for r in h["runs"]:
        print(
            f"    run {r['run_id'][:8]} {r['status']:<16} {r['events']:>6,} events "
            f"{_size(r['bytes']):>10}, started with {_size(r['started_input_bytes'])} of state"
        )
    for name, count in sorted(h["updates"].items()):
        print(f"    {name:<12} {count:>6,} updates, {h['bytes_per_update'][name]:,} B each")
    print(f"    + {h['overhead_bytes_per_update']:,} B an update of workflow-task events")
    print(
        f"  an hour flat out at this rate: {h['flat_out_updates_per_hour']:,} updates, "
        f"{h['flat_out_events_per_hour']:,} events, {_size(h['flat_out_bytes_per_hour'])}"
    )
    print(
        f"  an hour of steady state ({h['churn_per_hour']:.0%} of replicas replaced, 6 updates "
        f"each): {h['churn_updates_per_hour']:,} updates, {h['churn_events_per_hour']:,} events, "
        f"{_size(h['churn_bytes_per_hour'])}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (8 GPUs each)")
    parser.add_argument("--replicas", type=int, default=4000, help="replicas to place")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="updates in flight (Temporal admits 10 per workflow at once; default 8)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--churn-per-hour",
        type=float,
        default=0.10,
        help="share of replicas replaced an hour, for the steady-state history growth",
    )
    parser.add_argument("--json", dest="json_out", type=Path, help="also write figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")


def run(args: argparse.Namespace) -> int:
    options = Options(
        nodes=args.nodes,
        replicas=args.replicas,
        concurrency=args.concurrency,
        seed=args.seed,
        keep=args.keep,
        churn_per_hour=args.churn_per_hour,
        json_out=args.json_out,
    )
    started = time.monotonic()
    with scratch_dev_server(keep=options.keep) as (server, _workdir):
        try:
            figures = asyncio.run(bench(options, server.address))
        except WorkflowUpdateFailedError as err:
            print(f"an update failed: {err.cause or err}", file=sys.stderr)
            return 1
        figures["total_s"] = round(time.monotonic() - started, 1)
        report(figures)
        print(f"\ntook {figures['total_s']} s in all")
        if options.json_out is not None:
            options.json_out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmgw bench placement", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
