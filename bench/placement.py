"""`llmgw bench placement` (or `python -m bench.placement`): the ledger at fleet scale.

A command, not a test: it starts an embedded Temporal dev server (SQLite file, headless) in a
temporary directory and a control worker in this process, splits the ledger into `--cells`
cells (`set_cells` on cell 0, as `llmgw ledger cells N` does), registers simulated nodes, places
replicas and publishes each one's route through the control worker's ledger activities
(activities/control/ledger_cluster.py), as node and replica workflows do: a node registers in
its cell, a placement tries its model's last or home cell and else asks every cell for an
offer and places in the best, a route (`ready`, so with no look at cell 0) goes to its node's
cell. Then it prints their latency and, cell by cell, the ledger's state size against
Temporal's 2 MB payload limit, the time a new run takes to unpack it, and how history grows.

Only the ledger workflows run: no node agent, no replica workflow, no engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.control import ledger_cluster
from activities.control.ledger_calls import ledger_handle, on_cell, update_ledger
from activities.control.ledger_cluster import LedgerActivities, allocate
from bench.dev_server import scratch_dev_server
from bench.placement_measure import (
    DeadlockCounter,
    HistoryFigures,
    Timings,
    bounded,
    history_figures,
    json_bytes,
    timed_query,
    unpack_times,
)
from bench.placement_report import PAYLOAD_LIMIT, report
from bench.placement_table import paged_table
from bench.simulated_fleet import GPUS_PER_NODE, replica_mix, route_for, simulated_node
from workers import gc_policy
from workflows.client import connect
from workflows.contracts import (
    Allocation,
    LedgerCells,
    LedgerState,
    NodeRecord,
    PlacementRequest,
    Route,
)
from workflows.ledger import NO_PLACEMENT, ClusterLedgerWorkflow
from workflows.ledger_cells import NODES_PER_CELL, cell_of_node, merge_states
from workflows.ledger_compact import unpack_state
from workflows.names import CONTROL_TASK_QUEUE, ledger_cell_workflow_id

__all__ = ["PAYLOAD_LIMIT", "main"]


@dataclass
class Options:
    nodes: int = 1000
    replicas: int = 4000
    cells: int = 1
    concurrency: int = 8
    seed: int = 1
    keep: bool = False
    churn_per_hour: float = 0.10
    json_out: Path | None = None


async def read_cell(client: Client, cell: int) -> tuple[LedgerState, dict[str, Any]]:
    """One cell's state and what reading it costs: its packed state (what its next run is
    handed) and the time a new run takes to unpack it, its queries, its routing table as a
    gateway reads it."""
    handle = ledger_handle(client, cell)
    t = time.perf_counter()
    packed = await handle.query(ClusterLedgerWorkflow.packed_snapshot)
    packed_ms = 1000 * (time.perf_counter() - t)
    state = unpack_state(packed)
    return state, {
        "cell": cell,
        "nodes": len(state.nodes),
        "allocations": len(state.allocations),
        "routes": len(state.routes),
        "plain_json_bytes": json_bytes(state),
        "packed_payload_bytes": json_bytes(packed),
        "packed_snapshot_query_ms": round(packed_ms, 1),
        **unpack_times(packed),
        "snapshot_query": await timed_query(handle, ClusterLedgerWorkflow.snapshot),
        "routing_table_query": await timed_query(handle, ClusterLedgerWorkflow.routing_table),
        "routing_table_paged": await paged_table(handle),
    }


async def first_offers(client: Client, cells: int, req: PlacementRequest) -> list[float]:
    """Each cell's first offer, one cell at a time, in ms."""
    took = []
    for cell in range(cells):
        t = time.perf_counter()
        await on_cell(client, cell, lambda h: h.query(ClusterLedgerWorkflow.offer, req))
        took.append(round(1000 * (time.perf_counter() - t), 1))
    return took


async def bench(options: Options, address: str) -> dict[str, Any]:
    rng = random.Random(options.seed)
    gc_policy.for_large_state()  # as the control worker does
    client = await connect(address)
    deadlocks = DeadlockCounter()
    logging.getLogger("temporalio").addHandler(deadlocks)
    activities = LedgerActivities(client)
    worker = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        # The ledger alone: nothing else runs here, and the other workflows need node agents.
        workflows=[ClusterLedgerWorkflow],
        activities=activities.all(),
    )
    async with worker:
        # Before any node registers: a node's cell follows from the count.
        await update_ledger(
            client, ClusterLedgerWorkflow.set_cells, LedgerCells(cells=options.cells)
        )
        print(f"registering {options.nodes} nodes in {options.cells} cell(s) ...", file=sys.stderr)
        records = [simulated_node(i, rng) for i in range(options.nodes)]
        nodes_per_cell = Counter(cell_of_node(r.inventory.name, options.cells) for r in records)

        async def upsert(record: NodeRecord) -> float:
            t = time.perf_counter()
            await activities.upsert_node(record)
            return time.perf_counter() - t

        upserts = Timings()
        await bounded(records, upsert, options.concurrency, upserts, "upsert_node")

        print(f"placing {options.replicas} replicas ...", file=sys.stderr)
        replicas = replica_mix(options.replicas, rng)
        shapes = {r.request.replica_id: r.shape for r in replicas}
        allocations: dict[str, Allocation] = {}
        refused_by_shape: Counter[str] = Counter()
        # A cell builds its placement index at its first offer or placement, in one workflow
        # activation (workflows/ledger.py). Ten cells doing that at once in this one worker
        # process overran the SDK's 2 s deadlock detector: first one offer to each cell in
        # turn, timed.
        cold_offer_ms = await first_offers(client, options.cells, replicas[0].request)
        retried: Counter[str] = Counter()

        async def place(req: PlacementRequest, retry: bool = False) -> float | None:
            t = time.perf_counter()
            try:
                alloc = await allocate(client, req, retry=retry)
            except ApplicationError as err:
                if err.type != NO_PLACEMENT:
                    raise
                refused_by_shape[shapes[req.replica_id]] += 1
                return None
            except (WorkflowQueryFailedError, TimeoutError) as err:
                # A cell's offer failed (the deadlock detector, on a loaded machine) or took
                # longer than a query may: placed again, as the activity would be retried
                # (as a retry: it may have placed already), and counted.
                retried[f"{type(err).__name__}: {str(err)[:80]}"] += 1
                if sum(retried.values()) > 100:
                    raise
                return await place(req, retry=True)
            took = time.perf_counter() - t
            allocations[req.replica_id] = alloc
            return took

        places = Timings()
        await bounded([r.request for r in replicas], place, options.concurrency, places, "place")

        requests = {r.request.replica_id: r.request for r in replicas}
        routes = [route_for(a, requests[a.replica_id]) for a in allocations.values()]

        async def set_route(route: Route) -> float:
            t = time.perf_counter()
            while True:
                try:
                    await ledger_cluster.set_route(client, route)
                    break
                except TimeoutError as err:
                    # Its query to cell 0 outlasted the bound: again, as the activity would be.
                    retried[f"set_route: {type(err).__name__}"] += 1
                    if sum(retried.values()) > 100:
                        raise
            return time.perf_counter() - t

        route_timings = Timings()
        await bounded(routes, set_route, options.concurrency, route_timings, "set_route")

        # Before the slow reading below, so that a failure there does not lose them.
        partial = {name: t.figures() for name, t in (("upsert_node", upserts), ("place", places))}
        partial["set_route"] = route_timings.figures()
        print(f"round trips: {json.dumps(partial)}", file=sys.stderr)
        print("reading the ledger's cells: state and history ...", file=sys.stderr)
        states: list[LedgerState] = []
        cells: list[dict[str, Any]] = []
        history = HistoryFigures()
        for cell in range(options.cells):
            if cell and not nodes_per_cell[cell]:
                continue  # never started: no node of it registered
            state, read = await read_cell(client, cell)
            cell_history = await history_figures(client, ledger_cell_workflow_id(cell))
            read["history"] = {
                "runs": len(cell_history.runs),
                "events": cell_history.events,
                "bytes": cell_history.bytes,
                "largest_started_input_bytes": max(
                    r.started_input_bytes for r in cell_history.runs
                ),
            }
            states.append(state)
            cells.append(read)
            history.add(cell_history)
    logging.getLogger("temporalio").removeHandler(deadlocks)

    state = merge_states(states)
    timings = {"upsert_node": upserts, "place": places, "set_route": route_timings}
    busy_s = places.wall_s + route_timings.wall_s
    # Ledger updates a second while placing and routing (an offer is a query: no history).
    rate = (len(allocations) + places.refused + len(route_timings.samples)) / max(busy_s, 1e-9)
    packed = [c["packed_payload_bytes"] for c in cells]
    largest = cells[max(range(len(cells)), key=lambda c: packed[c])]["cell"]
    return {
        "nodes": options.nodes,
        "gpus": options.nodes * GPUS_PER_NODE,
        "replicas": options.replicas,
        "cells": options.cells,
        "nodes_per_cell": [nodes_per_cell[c] for c in range(options.cells)],
        "concurrency": options.concurrency,
        "placed": len(allocations),
        "refused_by_shape": dict(refused_by_shape),
        "gpus_allocated": sum(len(s.gpus) for a in state.allocations.values() for s in a.shards),
        "latency": {name: t.figures() for name, t in timings.items()},
        "deadlock_detector_failures": deadlocks.count,
        "cold_offer_ms": cold_offer_ms,
        "placements_retried": dict(retried),
        "state": {
            "plain_json_bytes": json_bytes(state),
            "nodes_bytes": json_bytes(state.nodes),
            "allocations_bytes": json_bytes(state.allocations),
            "routes_bytes": json_bytes(state.routes),
            "node_bytes_in_ledger": json_bytes(state.nodes) // max(1, len(state.nodes)),
            "node_bytes_as_discovered": json_bytes(records[0]) if records else 0,
            "packed_total_bytes": sum(packed),
            "largest_cell": largest,
        },
        "cells_read": cells,
        "history": history_summary(history, options, len(cells), len(allocations), rate),
    }


def history_summary(
    history: HistoryFigures, options: Options, cells: int, placed: int, rate: float
) -> dict[str, Any]:
    """History over every cell, summed, and what an hour adds, two ways. Flat out: updates
    arriving for an hour at the rate measured here (placing and routing a whole fleet without
    pause). Steady state: a share of the replicas replaced each hour (autoscaling, rolling
    updates, lost nodes), each replacement being a replica's six ledger updates: place,
    set_route starting/loading/ready, set_route stopping, release (release costs about what
    set_route does). Offers are queries and add nothing."""
    updates = sum(history.update_count.values())
    mean_bytes = {
        name: history.update_bytes[name] / count for name, count in history.update_count.items()
    }
    # What every update costs beyond its own two events: workflow task events.
    overhead = (history.bytes - sum(history.update_bytes.values())) / max(1, updates)
    events_per_update = history.events / max(1, updates)
    churn_replicas_h = options.churn_per_hour * placed
    churn_bytes_h = churn_replicas_h * (
        mean_bytes.get("place", 0.0) + 5 * mean_bytes.get("set_route", 0.0) + 6 * overhead
    )
    # A cell continues as new at Temporal's suggestion: the mean run's events, closed runs only.
    closed = [r.events for r in history.runs if r.status != "RUNNING"]
    churn_events_h = churn_replicas_h * 6 * events_per_update
    return {
        "runs": len(history.runs),
        "continue_as_new": len(history.runs) - cells,
        "events": history.events,
        "bytes": history.bytes,
        "updates": dict(history.update_count),
        "bytes_per_update": {k: round(v) for k, v in mean_bytes.items()},
        "overhead_bytes_per_update": round(overhead),
        "events_per_update": round(events_per_update, 2),
        "event_types": dict(history.event_types),
        "mean_closed_run_events": round(sum(closed) / len(closed)) if closed else None,
        "flat_out_updates_per_hour": round(rate * 3600),
        "flat_out_events_per_hour": round(rate * 3600 * events_per_update),
        "flat_out_bytes_per_hour": round(rate * 3600 * history.bytes / max(1, updates)),
        "churn_per_hour": options.churn_per_hour,
        "churn_updates_per_hour": round(churn_replicas_h * 6),
        "churn_events_per_hour": round(churn_events_h),
        "churn_events_per_hour_per_cell": round(churn_events_h / cells),
        "churn_bytes_per_hour": round(churn_bytes_h),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (8 GPUs each)")
    parser.add_argument("--replicas", type=int, default=4000, help="replicas to place")
    parser.add_argument(
        "--cells",
        type=int,
        help=f"ledger cells (default: one per {NODES_PER_CELL:,} nodes, rounded up: 2 for the "
        "default 1,000 nodes, 20 for 10,000)",
    )
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
        cells=args.cells or max(1, math.ceil(args.nodes / NODES_PER_CELL)),
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
