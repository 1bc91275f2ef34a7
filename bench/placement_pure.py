"""`python -m bench.placement_pure`: the ledger's own work at fleet scale, without Temporal.

`llmgw bench placement` drives a real ledger workflow, and at 10,000 nodes it cannot: the
ledger's state no longer fits one continue-as-new payload, and unpacking it outlasts a
workflow activation (both measured here). This runs what the ledger runs inside its handlers,
in one process, on the same simulated fleet (bench/simulated_fleet.py): placement with the
PlacementIndex the ledger keeps, and side by side on a sample of the same placements the way
it placed before (the index rebuilt for every placement); then the state as continue-as-new
would carry it, the time a new run takes to unpack it and build its index, and the routing
table as gateways read it.

Single-threaded and outside any workflow: Temporal adds its own time per update (see
docs/benchmarks.md, measured on a real ledger at 1,000 and 10,000 nodes).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.placement_table import json_bytes, table_pages
from bench.simulated_fleet import GPUS_PER_NODE, replica_mix, route_for, simulated_node
from workflows.contracts import Allocation, LedgerState
from workflows.ledger_compact import carried_state, compact_record, pack_state
from workflows.placement import PlacementIndex, place

PAYLOAD_LIMIT = 2 * 1024 * 1024
DEADLOCK_S = 2.0  # Temporal's Python SDK fails an activation that runs longer


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def ms(samples: list[float]) -> dict[str, float]:
    return {
        "count": len(samples),
        "p50_ms": round(1000 * pct(samples, 0.5), 2),
        "p90_ms": round(1000 * pct(samples, 0.9), 2),
        "p99_ms": round(1000 * pct(samples, 0.99), 2),
        "max_ms": round(1000 * max(samples or [0.0]), 2),
    }


def run(nodes: int, replicas: int, sample: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    state = LedgerState(route_log_floor=0)
    print(f"building {nodes} nodes ...", file=sys.stderr)
    for i in range(nodes):
        record = compact_record(simulated_node(i, rng))
        state.nodes[record.inventory.name] = record
    index = PlacementIndex(state)
    mix = replica_mix(replicas, rng)
    by_shape: dict[str, list[float]] = defaultdict(list)
    every: list[float] = []
    refused = 0
    print(f"placing {replicas} replicas ...", file=sys.stderr)
    for n, rep in enumerate(mix):
        t = time.perf_counter()
        decision = place(state, rep.request, index)
        took = time.perf_counter() - t
        every.append(took)
        by_shape[rep.shape].append(took)
        if isinstance(decision, Allocation):
            state.allocations[decision.replica_id] = decision
            index.add(decision)
            state.routes[decision.replica_id] = route_for(decision, rep.request)
        else:
            refused += 1
        if (n + 1) % max(1, replicas // 10) == 0:
            print(f"    {n + 1}/{replicas}", file=sys.stderr)
    # The same kind of placements as before the index: a fresh one per placement (what
    # cluster_usage() rebuilt), on the full fleet, for the last `sample` replicas placed.
    kept: list[float] = []
    rebuilt: list[float] = []
    for rep in mix[-sample:]:
        rid = rep.request.replica_id
        alloc = state.allocations.pop(rid, None)
        if alloc is None:
            continue
        index.remove(alloc)
        t = time.perf_counter()
        again = place(state, rep.request, index)
        kept.append(time.perf_counter() - t)
        t = time.perf_counter()
        fresh = place(state, rep.request, PlacementIndex(state))
        rebuilt.append(time.perf_counter() - t)
        assert again == fresh, rid
        assert isinstance(again, Allocation)
        state.allocations[rid] = again
        index.add(again)

    print("packing the state ...", file=sys.stderr)
    t = time.perf_counter()
    packed = pack_state(state)
    pack_s = time.perf_counter() - t
    t = time.perf_counter()
    carried = carried_state(packed)
    unpack_s = time.perf_counter() - t
    t = time.perf_counter()
    PlacementIndex(carried)
    index_s = time.perf_counter() - t
    packed_bytes = json_bytes(packed)
    return {
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "replicas": replicas,
        "placed": len(state.allocations),
        "refused": refused,
        "gpus_allocated": sum(len(s.gpus) for a in state.allocations.values() for s in a.shards),
        "place": ms(every),
        "place_by_shape": {shape: ms(v) for shape, v in sorted(by_shape.items())},
        "side_by_side": {
            "kept_index": ms(kept),
            "index_rebuilt_each_placement": ms(rebuilt),
            "mean_ratio": round(sum(rebuilt) / max(sum(kept), 1e-9), 1),
        },
        "state": {
            "plain_json_bytes": json_bytes(state),
            "nodes_bytes": json_bytes(state.nodes),
            "allocations_bytes": json_bytes(state.allocations),
            "routes_bytes": json_bytes(state.routes),
            "route_log_bytes": json_bytes(state.route_log),
            "packed_payload_bytes": packed_bytes,
            "over_payload_limit": round(packed_bytes / PAYLOAD_LIMIT, 2),
            "pack_s": round(pack_s, 2),
            "unpack_s": round(unpack_s, 2),
            "index_build_s": round(index_s, 2),
        },
        "routing_table": table_pages(state),
    }


def report(f: dict[str, Any]) -> None:
    st, rt, sbs = f["state"], f["routing_table"], f["side_by_side"]
    print(f"\nledger work without Temporal: {f['nodes']:,} nodes x {GPUS_PER_NODE} GPUs")
    print(
        f"placed {f['placed']:,} of {f['replicas']:,} replicas on {f['gpus_allocated']:,} of "
        f"{f['gpus']:,} GPUs, refused {f['refused']}"
    )
    p = f["place"]
    print(
        f"place(), one at a time: p50 {p['p50_ms']} ms  p90 {p['p90_ms']}  p99 {p['p99_ms']}  "
        f"max {p['max_ms']}"
    )
    for shape, s in f["place_by_shape"].items():
        print(f"  {shape:<24} {s['count']:>6}  p50 {s['p50_ms']:8.2f}  p99 {s['p99_ms']:8.2f} ms")
    k, r = sbs["kept_index"], sbs["index_rebuilt_each_placement"]
    print(
        f"side by side, the last {k['count']} placements again: kept index p50 {k['p50_ms']} ms "
        f"p99 {k['p99_ms']}; rebuilt each time p50 {r['p50_ms']} ms p99 {r['p99_ms']} "
        f"({sbs['mean_ratio']}x the time)"
    )
    print(
        f"state: plain JSON {st['plain_json_bytes'] / 2**20:.1f} MB (nodes "
        f"{st['nodes_bytes'] / 2**20:.1f}, allocations {st['allocations_bytes'] / 2**20:.1f}, "
        f"routes {st['routes_bytes'] / 2**20:.1f}, route log {st['route_log_bytes'] / 1024:.0f} KB)"
    )
    verdict = "OVER" if st["packed_payload_bytes"] > PAYLOAD_LIMIT else "under"
    print(
        f"  packed for continue-as-new: {st['packed_payload_bytes'] / 2**20:.2f} MB, {verdict} "
        f"the 2 MB payload limit ({st['over_payload_limit']}x it)"
    )
    slow = "OVER" if st["unpack_s"] + st["index_build_s"] > DEADLOCK_S else "under"
    print(
        f"  a new run's first activation: unpack {st['unpack_s']} s + index {st['index_build_s']} "
        f"s, {slow} the SDK's {DEADLOCK_S:.0f} s deadlock limit"
    )
    print(
        f"routing table: {rt['routes']:,} routes, whole {rt['whole_table_bytes'] / 2**20:.2f} MB; "
        f"as gateways read it {rt['pages']} pages, largest {rt['largest_page_bytes'] / 1024:.0f} "
        f"KB ({rt['pages_ms']:.0f} ms to answer them all); one changed route: "
        f"{rt['one_route_delta_bytes']} B"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement_pure", description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=40_000)
    parser.add_argument("--sample", type=int, default=50, help="placements timed side by side")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", dest="json_out", type=Path)
    args = parser.parse_args(argv)
    started = time.monotonic()
    figures = run(args.nodes, args.replicas, args.sample, args.seed)
    figures["total_s"] = round(time.monotonic() - started, 1)
    report(figures)
    print(f"\ntook {figures['total_s']} s in all")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
