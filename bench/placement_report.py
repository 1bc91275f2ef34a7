"""`llmgw bench placement`'s figures as text (bench/placement.py gathers them)."""

from __future__ import annotations

from typing import Any

from bench.simulated_fleet import GPUS_PER_NODE

# Temporal refuses a payload over 2 MB (the dev server's default blob size limit); each ledger
# cell carries its whole state through continue-as-new as one payload.
PAYLOAD_LIMIT = 2 * 1024 * 1024
# The Python SDK fails a workflow activation that runs longer (its deadlock detector).
ACTIVATION_LIMIT_S = 2.0


def _size(n: object) -> str:
    assert isinstance(n, int | float)
    return f"{n / 1024:,.1f} KB" if n < 1024 * 1024 else f"{n / 1024 / 1024:,.2f} MB"


def _query(q: dict[str, Any]) -> str:
    if q["ok"]:
        return f"{_size(q['bytes'])} {q['ms']:.0f} ms"
    return f"FAILED {q['ms']:.0f} ms"


def report(f: dict[str, Any]) -> None:
    st, h = f["state"], f["history"]
    print()
    print(
        f"ledger at scale: {f['nodes']:,} nodes x {GPUS_PER_NODE} GPUs in {f['cells']} cell(s) "
        f"({min(f['nodes_per_cell']):,}-{max(f['nodes_per_cell']):,} nodes a cell), "
        f"{f['replicas']:,} replicas, {f['concurrency']} calls in flight"
    )
    refused = sum(f["refused_by_shape"].values())
    print(
        f"placed {f['placed']:,} replicas on {f['gpus_allocated']:,} of {f['gpus']:,} GPUs, "
        f"refused {refused}" + (f" {f['refused_by_shape']}" if refused else "")
    )
    print(
        "round trips through the control worker's ledger activities (a placement: `place` on "
        "its model's last or home cell; where that refuses, an offer query to every cell, then "
        "`place` on the best):"
    )
    for name, t in f["latency"].items():
        print(
            f"  {name:<12} {t['count']:>6} in {t['wall_s']:7.1f} s ({t['per_s']:6.1f}/s)   ms: "
            f"p50 {t['p50_ms']:6.1f}  p90 {t['p90_ms']:6.1f}  p99 {t['p99_ms']:6.1f}  "
            f"max {t['max_ms']:7.1f}"
        )
    print(
        f"  each cell's first offer (it builds its placement index), one at a time: "
        f"{', '.join(f'{ms:.0f}' for ms in f['cold_offer_ms'])} ms"
    )
    print(
        f"  activations failed by the SDK's deadlock detector: {f['deadlock_detector_failures']}"
        f"; placements tried again after an offer failed: {sum(f['placements_retried'].values())}"
        + (f" {f['placements_retried']}" if f["placements_retried"] else "")
    )
    print(
        f"ledger state, all cells: plain JSON {_size(st['plain_json_bytes'])} (nodes "
        f"{_size(st['nodes_bytes'])}, {st['node_bytes_in_ledger']:,} B a node, "
        f"{st['node_bytes_as_discovered']:,} B as discovered; allocations "
        f"{_size(st['allocations_bytes'])}; routes {_size(st['routes_bytes'])}); "
        f"packed {_size(st['packed_total_bytes'])}"
    )
    print(
        "  cell  nodes  allocs  routes    packed  unpack+index   packed_snapshot  snapshot"
        "            routing_table (whole)  paged: pages, largest, ms   runs  events"
    )
    for c in f["cells_read"]:
        pg = c["routing_table_paged"]
        print(
            f"  {c['cell']:>4} {c['nodes']:>6} {c['allocations']:>7} {c['routes']:>7} "
            f"{_size(c['packed_payload_bytes']):>9}  "
            f"{c['unpack_s']:5.2f}+{c['index_build_s']:4.2f} s"
            f"   {c['packed_snapshot_query_ms']:6.0f} ms        {_query(c['snapshot_query']):<18}  "
            f"{_query(c['routing_table_query']):<21}  {pg['pages']:>3}, "
            f"{_size(pg['largest_page_bytes'])}, {pg['ms']:.0f}   {c['history']['runs']:>5} "
            f"{c['history']['events']:>7,}"
        )
    big = next(c for c in f["cells_read"] if c["cell"] == st["largest_cell"])
    packed = big["packed_payload_bytes"]
    verdict = "under" if packed < PAYLOAD_LIMIT else "OVER"
    slow = big["unpack_s"]
    print(
        f"  largest cell ({big['cell']}): packed {_size(packed)}, {verdict} the 2 MB payload "
        f"limit ({PAYLOAD_LIMIT / packed:.1f}x headroom); a new run unpacks it in {slow:.2f} s "
        f"(outside a workflow), {'under' if slow < ACTIVATION_LIMIT_S else 'OVER'} the "
        f"{ACTIVATION_LIMIT_S:.0f} s activation limit, and builds its index in "
        f"{big['index_build_s']:.2f} s at its first placement"
    )
    print("ledger history, all cells:")
    print(
        f"  {h['runs']} runs ({h['continue_as_new']} continue-as-new), {h['events']:,} events, "
        f"{_size(h['bytes'])}; {h['events_per_update']:.2f} events an update"
        + (
            f"; a closed run held {h['mean_closed_run_events']:,} events on average"
            if h["mean_closed_run_events"]
            else ""
        )
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
        f"each): {h['churn_updates_per_hour']:,} updates, {h['churn_events_per_hour']:,} events "
        f"({h['churn_events_per_hour_per_cell']:,} a cell), {_size(h['churn_bytes_per_hour'])}"
    )
