"""The ledger split into cells, so that no one workflow carries every node.

One ledger workflow carries its whole state into each new run as one payload, and Temporal
refuses a payload over 2 MB and a workflow activation over 2 s: at 10,000 eight-GPU nodes and
40,000 replicas the state packs to about 8 MB and takes seconds to unpack (docs/benchmarks.md).
So a big cluster's ledger is `cells` workflows (`llmgw ledger cells N`, set before any node
joins). A node belongs to one cell, chosen by its name alone (cell_of_node), and its cell holds
its record, every allocation whose leader is on it and every route of those replicas: each
cell is a whole ledger for its nodes, placing one replica at a time as before. Cell 0, the
`cluster` workflow, also holds the idle models, the routes of replicas not placed yet and those
of external endpoints.

What spans cells is done by the control worker's ledger activities (activities/control/
ledger_cluster.py): a placement tries the cell its model's last replica went to (at first the
model's home cell), else asks every cell for an offer (a query, no history) and places in the
best; readers merge the cells' states
and routing tables. A replica placed across several nodes is placed within one cell: its nodes
must share a cell as well as a fabric.

Pure: the ledger, the activities and the gateway all use it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

from workflows.contracts import LedgerState, PlacementOffer, Route
from workflows.names import EXTERNAL_NODE

# More would be a fleet far past anything measured (docs/benchmarks.md), or a typo.
MAX_CELLS = 256
# Nodes to a cell, as docs/operations.md suggests. A cell of 1,000 nodes and 4,000 replicas
# packs to about 820 KB, well within the 2 MB payload limit; what sets the size is the time a
# new run takes to unpack it in its first activation, which the Python SDK fails past 2 s
# (its deadlock detector). That took 0.44 s on a quiet 2-core machine and over 2 s on the same
# machine under load, and a detector failure can leave the run stuck in the worker until the
# worker restarts (seen at 10,000 nodes in 10 cells: docs/benchmarks.md). Half that is kept.
NODES_PER_CELL = 500


def cell_of_node(node: str, cells: int) -> int:
    """The cell a node belongs to, from its name alone: every process agrees without asking,
    and `llmgw ledger rebuild` puts each node back where it was. crc32, not hash(): the same
    in every process whatever its PYTHONHASHSEED."""
    if cells <= 1 or not node or node == EXTERNAL_NODE:
        return 0
    return zlib.crc32(node.encode()) % cells


def home_cell(model: str, cells: int) -> int:
    """Where a model's first placement in a control worker is tried before any cell is asked
    for an offer: from its name alone, so models spread over the cells (and their placements
    over the cells' workflows) and every control worker tries the same one."""
    if cells <= 1:
        return 0
    return zlib.crc32(f"model:{model}".encode()) % cells


def cell_of_route(route: Route, cells: int) -> int:
    """A route lives with its node; one with no node yet (a pending replica) or an external
    endpoint lives in cell 0."""
    return cell_of_node(route.node, cells)


def offer_order(offers: Sequence[PlacementOffer | None]) -> list[int]:
    """The cells to place in, best first, from each cell's offer (None: the cell is not
    there). A replica's first profile that fits anywhere wins, as in one ledger; then a cell
    whose node already holds the weights; then the lowest cell, so what the models' home cells
    (home_cell) cannot take fills the cells in turn, as one ledger fills its nodes. A cell that
    placed it already (a retry) comes first."""
    fitting = [
        (not o.held, o.profile_index, o.fetches, cell)
        for cell, o in enumerate(offers)
        if o is not None and o.fits
    ]
    return [entry[-1] for entry in sorted(fitting)]


def refusal_summary(offers: Sequence[PlacementOffer | None], limit: int) -> str:
    """Every cell's refusal in one line of at most `limit` characters."""
    parts = []
    for cell, offer in enumerate(offers):
        why = offer.summary if offer is not None else "no nodes have registered"
        parts.append(why if len(offers) == 1 else f"cell {cell}: {why}")
    line = "; ".join(parts)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def merge_states(states: Sequence[LedgerState]) -> LedgerState:
    """The cells' states as one ledger's, cell 0 first: what `llmgw nodes`, `llmgw status` and
    the console read. A replica's route in a later cell wins over cell 0's (it was pending
    there, and has been placed since)."""
    if len(states) == 1:
        return states[0]
    merged = LedgerState(
        idle_models=list(states[0].idle_models),
        version=sum(s.version for s in states),
        cells=states[0].cells,
    )
    for state in states:
        merged.nodes.update(state.nodes)
        merged.allocations.update(state.allocations)
        merged.routes.update(state.routes)
    return merged


def merge_routes(tables: Iterable[Iterable[Route]]) -> dict[str, Route]:
    """The routes of every cell by replica id, cell 0 first (see merge_states)."""
    merged: dict[str, Route] = {}
    for routes in tables:
        merged.update((route.replica_id, route) for route in routes)
    return merged


def split_state(state: LedgerState, cells: int) -> list[LedgerState]:
    """One ledger's state as `cells` cells' (`llmgw ledger rebuild` of a cluster with cells)."""
    parts = [LedgerState(cells=cells, cell=cell) for cell in range(cells)]
    parts[0].idle_models = list(state.idle_models)
    for name, record in state.nodes.items():
        parts[cell_of_node(name, cells)].nodes[name] = record
    for rid, alloc in state.allocations.items():
        parts[cell_of_node(alloc.node, cells)].allocations[rid] = alloc
    for rid, route in state.routes.items():
        parts[cell_of_route(route, cells)].routes[rid] = route
    return parts
