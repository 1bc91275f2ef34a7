"""`make bench-ledger-sandbox` (`python -m bench.ledger_sandbox`): the ledger workflow in
Temporal's workflow sandbox and without it, side by side in one run.

Two dev servers, each with one ledger and a worker in this process: one runs the ledger as it
is (`@workflow.defn(sandboxed=False)`), the other the same handlers defined sandboxed (the
SDK's default, and how the ledger ran before). Both register the same simulated nodes;
then the same placements go to each in alternating rounds (so a change in the machine's load
falls on both), `--concurrency` in flight, through the control worker's ledger activities as
replicas place. Prints each side's throughput and latency and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

from temporalio.client import Client
from temporalio.worker import Worker

from activities.control.ledger_cluster import LedgerActivities, allocate
from bench.dev_server import scratch_dev_server
from bench.placement_measure import Timings, bounded
from bench.sandboxed_ledger import SandboxedLedger
from bench.simulated_fleet import replica_mix, simulated_node
from workflows.client import connect
from workflows.contracts import NodeRecord, PlacementRequest
from workflows.ledger import ClusterLedgerWorkflow
from workflows.names import CONTROL_TASK_QUEUE

WORKFLOWS = {"sandboxed": SandboxedLedger, "unsandboxed": ClusterLedgerWorkflow}


@dataclass
class Side:
    name: str
    client: Client
    activities: LedgerActivities
    upserts: Timings = field(default_factory=Timings)
    places: Timings = field(default_factory=Timings)


def rounds(items: list[PlacementRequest], size: int) -> Iterator[list[PlacementRequest]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def bench(addresses: dict[str, str], nodes: int, replicas: int, concurrency: int) -> None:
    rng = random.Random(1)
    records = [simulated_node(i, rng) for i in range(nodes)]
    mix = [r.request for r in replica_mix(replicas, rng)]
    sides = [await _side(addresses[name], name) for name in WORKFLOWS]
    async with _worker(sides[0]), _worker(sides[1]):
        for side in sides:
            print(f"{side.name}: registering {nodes} nodes ...", file=sys.stderr)

            async def upsert(record: NodeRecord, side: Side = side) -> float:
                await side.activities.upsert_node(record)
                return 0.0

            await bounded(records, upsert, concurrency, side.upserts, f"{side.name} upsert")
        print(f"placing {replicas} replicas in rounds of 200, alternating ...", file=sys.stderr)
        for batch in rounds(mix, 200):
            for side in sides:
                timings = Timings()

                async def place(req: PlacementRequest, side: Side = side) -> float:
                    loop = asyncio.get_running_loop()
                    t = loop.time()
                    await allocate(side.client, req)
                    return loop.time() - t

                await bounded(batch, place, concurrency, timings, "")
                side.places.samples.extend(timings.samples)
                side.places.wall_s += timings.wall_s
    report(sides)


async def _side(address: str, name: str) -> Side:
    client = await connect(address)
    return Side(name, client, LedgerActivities(client))


def _worker(side: Side) -> Worker:
    """A control worker for the ledger alone, in or out of the sandbox."""
    return Worker(
        side.client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=[WORKFLOWS[side.name]],
        activities=side.activities.all(),
    )


def report(sides: list[Side]) -> None:
    figures = {side.name: side.places.figures() for side in sides}
    for side in sides:
        f = figures[side.name]
        print(
            f"{side.name:>12}: place {f['count']} at {f['per_s']}/s, p50 {f['p50_ms']} ms, "
            f"p90 {f['p90_ms']} ms, p99 {f['p99_ms']} ms, max {f['max_ms']} ms"
        )
    s, u = figures["sandboxed"], figures["unsandboxed"]
    print(
        f"unsandboxed/sandboxed: throughput {u['per_s'] / s['per_s']:.2f}x, "
        f"p50 {u['p50_ms'] / s['p50_ms']:.2f}x, p99 {u['p99_ms'] / s['p99_ms']:.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_sandbox", description=__doc__)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=1200)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        addresses = {
            name: stack.enter_context(scratch_dev_server())[0].address for name in WORKFLOWS
        }
        asyncio.run(bench(addresses, args.nodes, args.replicas, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
