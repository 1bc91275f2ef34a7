"""The routing table as gateways read it from the ledger (gateway/route_source.py): page by
page, then deltas. Used by `llmgw bench placement` on a running ledger and by
bench/placement_pure.py on a state built without Temporal."""

from __future__ import annotations

import time

from pydantic_core import to_json
from temporalio.client import WorkflowHandle

from gateway.route_book import add_page, start_book
from workflows.contracts import LedgerState, RoutingTableRequest
from workflows.ledger import ClusterLedgerWorkflow
from workflows.route_log import answer, note_change, page


def json_bytes(value: object) -> int:
    return len(to_json(value))


async def paged_table(handle: WorkflowHandle[ClusterLedgerWorkflow, None]) -> dict[str, object]:
    """The table as a gateway reads it (gateway/route_source.py): page by page, then what it
    is sent when nothing routed has changed."""
    t = time.perf_counter()
    sizes: list[int] = []
    first = await handle.query(
        ClusterLedgerWorkflow.routing_table, RoutingTableRequest(deltas=True)
    )
    sizes.append(json_bytes(first))
    book = start_book(first)
    cursor = first.next_after
    while cursor:
        ask = RoutingTableRequest(epoch=book.epoch, deltas=True, after=cursor)
        page = await handle.query(ClusterLedgerWorkflow.routing_table, ask)
        sizes.append(json_bytes(page))
        add_page(book, page)
        cursor = page.next_after
    whole_ms = 1000 * (time.perf_counter() - t)
    again = await handle.query(ClusterLedgerWorkflow.routing_table, book.asking())
    return {
        "pages": len(sizes),
        "routes": len(book.routes),
        "largest_page_bytes": max(sizes),
        "total_bytes": sum(sizes),
        "ms": round(whole_ms, 1),
        "poll_answer_bytes": json_bytes(again),
        "poll_unchanged": again.unchanged,
    }


def table_pages(state: LedgerState) -> dict[str, object]:
    """The same figures from the ledger's state directly (workflows/route_log.py), with the
    whole table's size for comparison, and what one changed route costs a gateway."""
    t = time.perf_counter()
    sizes: list[int] = []
    after = ""
    while True:
        reply = page(state, after, "bench", lambda r: r)
        sizes.append(json_bytes(reply))
        after = reply.next_after
        if not after:
            break
    pages_ms = 1000 * (time.perf_counter() - t)
    whole = json_bytes(list(state.routes.values()))
    held = RoutingTableRequest(epoch="bench", version=state.version, deltas=True)
    changed = next(iter(state.routes.values()), None)
    delta_bytes = 0
    if changed is not None:
        state.version += 1
        note_change(state, replica_id=changed.replica_id)
        delta_bytes = json_bytes(answer(state, held, "bench", lambda r: r))
    return {
        "routes": len(state.routes),
        "whole_table_bytes": whole,
        "pages": len(sizes),
        "largest_page_bytes": max(sizes),
        "pages_ms": round(pages_ms, 1),
        "one_route_delta_bytes": delta_bytes,
    }
