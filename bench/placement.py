"""`llmgw bench placement` (or `python -m bench.placement`): placement on the fleet tables.

A command, not a test. It creates the fleet tables in a scratch SQLite file or in a scratch
schema of a PostgreSQL database (`--database-url`), registers simulated 8-GPU nodes, then places
replicas (`--in-flight` at a time) and publishes each one's route through the control worker's
own activities (activities/control/fleet_activities.py), split between `--placers` placers as
several control workers would be, each with its own memory of the fleet and its own
connections. It prints placements a second and their latency, how many commits met a node
another placer had changed (and were decided again), what a gateway's read of the routing
table costs when nothing changed and when one route did, and then checks the tables: no port or
GPU held twice, no node holding more cores or memory than it has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from activities.control.fleet_activities import FleetActivities
from bench.simulated_fleet import Replica, replica_mix, route_for, simulated_node
from store.fleet import Conflict, FleetTables, open_fleet
from workflows.contracts import Allocation, LedgerState, PlacementRequest, RoutingTableRequest
from workflows.placement import PlacementIndex


def pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(samples: list[float]) -> dict[str, float]:
    return {
        "p50": round(pct(samples, 0.5) * 1000, 2),
        "p99": round(pct(samples, 0.99) * 1000, 2),
        "max": round(max(samples, default=float("nan")) * 1000, 2),
    }


async def scratch_tables(
    url: str | None, directory: Path, placers: int
) -> tuple[list[FleetTables], str | None]:
    """`placers` handles on one scratch database: a fresh schema for PostgreSQL (named, for
    drop_scratch), a fresh file for SQLite."""
    if url is None:
        return [open_fleet(None, directory) for _ in range(placers)], None
    import asyncpg

    schema = f"bench_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
    finally:
        await conn.close()
    sep = "&" if "?" in url else "?"
    scoped = f"{url}{sep}options=-csearch_path%3D{schema}"
    return [open_fleet(scoped, directory) for _ in range(placers)], schema


async def drop_scratch(url: str | None, schema: str | None, tables: list[FleetTables]) -> None:
    for t in tables:
        await t.close()
    if url is None or schema is None:
        return
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
    finally:
        await conn.close()


def double_booked(state: LedgerState) -> list[str]:
    """Every port or GPU two allocations hold, and every node over its cores or memory."""
    problems: list[str] = []
    held: dict[tuple[str, str], str] = {}
    for alloc in state.allocations.values():
        for shard in alloc.shards_or_leader():
            items = [f"port {shard.port}", *(f"gpu {g}" for g in shard.gpus)]
            for item in items:
                other = held.setdefault((shard.node, item), alloc.replica_id)
                if other != alloc.replica_id:
                    problems.append(f"{shard.node} {item}: {other} and {alloc.replica_id}")
    index = PlacementIndex(state)  # every node's usage in one pass over the allocations
    for name, record in state.nodes.items():
        used = index.used(name)
        if used.cpu_cores > record.inventory.cpu_cores:
            problems.append(f"{name}: {used.cpu_cores} cores of {record.inventory.cpu_cores}")
        if used.memory_mb > record.inventory.memory_mb:
            problems.append(f"{name}: {used.memory_mb} MB of {record.inventory.memory_mb}")
    return problems


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-placement-") as scratch:
        tables, schema = await scratch_tables(args.database_url, Path(scratch), args.placers)
        try:
            await tables[0].init()
            return await _measure(args, rng, tables)
        finally:
            await drop_scratch(args.database_url, schema, tables)


async def _measure(
    args: argparse.Namespace, rng: random.Random, tables: list[FleetTables]
) -> dict[str, Any]:
    placers = [FleetActivities(t) for t in tables]
    print(f"registering {args.nodes} nodes ...", file=sys.stderr)
    started = time.perf_counter()
    records = [simulated_node(i, rng) for i in range(args.nodes)]
    for record in records:
        await placers[0].upsert_node(record)
    register_s = time.perf_counter() - started
    replicas = replica_mix(args.replicas, rng)
    # Each placer's first placement reads every node and allocation: timed apart.
    loads = []
    for p in placers:
        t = time.perf_counter()
        await p.placer._ready()
        loads.append(time.perf_counter() - t)
    print(f"placing {args.replicas} replicas, {args.in_flight} in flight ...", file=sys.stderr)
    latencies: list[float] = []
    route_latencies: list[float] = []
    refused: Counter[str] = Counter()
    queue: asyncio.Queue[tuple[int, Replica]] = asyncio.Queue()
    for n, replica in enumerate(replicas):
        queue.put_nowait((n, replica))
    conflicts_before = await _conflicts(placers)

    async def lane(lane_no: int) -> None:
        placer = placers[lane_no % len(placers)]
        while not queue.empty():
            _, replica = queue.get_nowait()
            t = time.perf_counter()
            decision = await placer.place(replica.request)
            latencies.append(time.perf_counter() - t)
            if not isinstance(decision, Allocation):
                refused[replica.shape] += 1
                continue
            t = time.perf_counter()
            await placer.set_route(route_for(decision, replica.request))
            route_latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    await asyncio.gather(*(lane(i) for i in range(args.in_flight)))
    placing_s = time.perf_counter() - started
    redecided = await _conflicts(placers) - conflicts_before
    gateway = await _gateway_reads(tables[0], placers[0], replicas[0].request)
    state = await tables[0].snapshot()
    problems = double_booked(state)
    return {
        "backend": "postgresql" if args.database_url else "sqlite",
        "nodes": args.nodes,
        "replicas": args.replicas,
        "in_flight": args.in_flight,
        "placers": args.placers,
        "register_s": round(register_s, 1),
        "first_read_s": [round(x, 2) for x in loads],
        "placed": len(state.allocations),
        "refused": dict(refused),
        "placements_per_s": round(len(latencies) / placing_s, 1),
        "place_ms": ms(latencies),
        "set_route_ms": ms(route_latencies),
        "decided_again": redecided,
        "gateway": gateway,
        "double_booked": problems[:10],
        "double_booked_count": len(problems),
    }


async def _conflicts(placers: list[FleetActivities]) -> int:
    return sum(p.placer.redecided for p in placers)


async def _gateway_reads(
    tables: FleetTables, activities: FleetActivities, probe: PlacementRequest
) -> dict[str, Any]:
    """What a gateway's poll costs: the whole table once, then nothing changed, then one
    route changed."""
    t = time.perf_counter()
    whole = await tables.routing_table(None)
    whole_s = time.perf_counter() - t
    held = RoutingTableRequest(epoch=whole.epoch, version=whole.version, deltas=True)
    unchanged: list[float] = []
    for _ in range(50):
        t = time.perf_counter()
        answer = await tables.routing_table(held)
        unchanged.append(time.perf_counter() - t)
        assert answer.unchanged
    route = next(r for r in whole.routes if r.replica_id != probe.replica_id)
    await activities.set_route(route.model_copy(update={"detail": "changed"}))
    t = time.perf_counter()
    delta = await tables.routing_table(held)
    delta_s = time.perf_counter() - t
    if not delta.delta or len(delta.routes) != 1:
        raise Conflict(f"one changed route read as {len(delta.routes)} (delta={delta.delta})")
    return {
        "routes": len(whole.routes),
        "whole_ms": round(whole_s * 1000, 1),
        "unchanged_ms": ms(unchanged),
        "one_change_ms": round(delta_s * 1000, 2),
    }


def report(f: dict[str, Any]) -> None:
    print(
        f"\nplacement on {f['backend']}: {f['nodes']} nodes, {f['replicas']} replicas, "
        f"{f['in_flight']} in flight over {f['placers']} placer(s)"
    )
    print(f"  registered the nodes in {f['register_s']} s; first read {f['first_read_s']} s")
    p = f["place_ms"]
    print(
        f"  placements: {f['placements_per_s']}/s, p50 {p['p50']} ms, p99 {p['p99']} ms, "
        f"max {p['max']} ms; {f['placed']} placed, refused {f['refused'] or 'none'}"
    )
    r = f["set_route_ms"]
    print(f"  set_route: p50 {r['p50']} ms, p99 {r['p99']} ms")
    print(f"  commits that met a node changed by another placer: {f['decided_again']}")
    g = f["gateway"]
    u = g["unchanged_ms"]
    print(
        f"  a gateway's read: whole table ({g['routes']} routes) {g['whole_ms']} ms; "
        f"nothing changed p50 {u['p50']} ms p99 {u['p99']} ms; one route changed "
        f"{g['one_change_ms']} ms"
    )
    print(f"  double-booked: {f['double_booked_count']}")
    for line in f["double_booked"]:
        print(f"    {line}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=4000)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--placers", type=int, default=1, help="control workers racing")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--database-url",
        help="a PostgreSQL URL to run in a scratch schema of (default: a scratch SQLite file)",
    )
    parser.add_argument("--json", help="also write the figures to this file")


def run(args: argparse.Namespace) -> int:
    figures = asyncio.run(bench(args))
    report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 1 if figures["double_booked_count"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmgw bench placement", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
