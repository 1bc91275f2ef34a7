"""The fleet's resources and routes in the store: every read and write the control plane and
the gateways make of them, each one transaction (schema.py says what each table is)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.fleet import schema
from store.fleet.db import Conflict, Db, Row, Tx
from store.fleet.routes import served_route, stored_route
from workflows.contracts import (
    Allocation,
    LedgerState,
    NodeRecord,
    NodeState,
    ReplicaRef,
    ReplicaState,
    Route,
    RoutingTable,
    RoutingTableRequest,
)

# Every this many route versions, tombstones older than KEEP_VERSIONS are pruned.
PRUNE_EVERY = 500
KEEP_VERSIONS = 5_000
# Names bound in one `IN (...)` (SQLite allows 32,766 parameters, PostgreSQL 65,535).
NAMES_PER_READ = 500


def new_rev() -> int:
    """A node's next rev: random, so two writers that both read rev r can never both commit
    what they decided on it (each writes `WHERE rev = r` and sets a value of its own)."""
    return secrets.randbits(62) + 1


def claims(alloc: Allocation) -> list[tuple[str, str]]:
    """(node, item) for every port and GPU the allocation holds: the rows that make double
    booking impossible."""
    held: list[tuple[str, str]] = []
    for shard in alloc.shards_or_leader():
        held.append((shard.node, f"port:{shard.port}"))
        held.extend((shard.node, f"port:{port}") for port in shard.extra_ports.values())
        held.extend((shard.node, f"gpu:{index}") for index in shard.gpus)
    return held


@dataclass
class NodeRow:
    record: NodeRecord
    rev: int


@dataclass
class NodeLoad:
    """One node as placement reloads it: its row (None: gone) and the allocations on it."""

    name: str
    row: NodeRow | None
    allocations: list[Allocation] = field(default_factory=list)


class FleetTables:
    def __init__(self, db: Db) -> None:
        self.db = db
        # PostgreSQL locks the row a write reads first; SQLite's BEGIN IMMEDIATE locked the
        # whole file already. Never input: one of two constants.
        self._select_for_update = " FOR UPDATE" if db.dialect == "postgres" else ""

    async def init(self) -> None:
        await schema.create(self.db)

    async def close(self) -> None:
        await self.db.close()

    # --- nodes --------------------------------------------------------------------------

    async def upsert_node(self, record: NodeRecord) -> bool:
        """Write a node's record (REMOVED deletes its row). Nothing is written when nothing
        changed; when its state changes, the routes on it take a new version (gateways see
        them withdrawn or back). True when anything was written."""
        name = record.inventory.name
        doc = record.model_dump_json()
        async with self.db.transaction() as tx:
            before = await tx.fetchone(
                f"SELECT state, record FROM fleet_nodes WHERE name = ?{self._select_for_update}",  # noqa: S608
                name,
            )
            if record.state == NodeState.REMOVED:
                if before is None:
                    return False
                await tx.execute("DELETE FROM fleet_nodes WHERE name = ?", name)
            elif before is None:
                await tx.execute(
                    "INSERT INTO fleet_nodes (name, state, rev, record) VALUES (?, ?, ?, ?)",
                    name,
                    record.state.value,
                    new_rev(),
                    doc,
                )
            elif before[1] == doc:
                return False
            else:
                await tx.execute(
                    "UPDATE fleet_nodes SET state = ?, rev = ?, writer = '', record = ? "
                    "WHERE name = ?",
                    record.state.value,
                    new_rev(),
                    doc,
                    name,
                )
            was = before[0] if before is not None else None
            now = None if record.state == NodeState.REMOVED else record.state.value
            if was != now:
                version = await _next_version(tx)
                await tx.execute(
                    "UPDATE fleet_routes SET version = ? WHERE node = ? AND doc IS NOT NULL",
                    version,
                    name,
                )
        return True

    async def node_rows(self) -> dict[str, NodeRow]:
        async with self.db.transaction(readonly=True) as tx:
            rows = await tx.fetch("SELECT record, rev FROM fleet_nodes")
        return {r.inventory.name: NodeRow(r, rev) for r, rev in _records(rows)}

    async def node_revs(self) -> dict[str, tuple[int, str]]:
        """Every node's rev and the placer that wrote it last ("" for any other write): what a
        placer compares with what it holds."""
        async with self.db.transaction(readonly=True) as tx:
            rows = await tx.fetch("SELECT name, rev, writer FROM fleet_nodes")
        return {str(name): (int(rev), str(writer)) for name, rev, writer in rows}

    async def node_state(self, name: str) -> NodeState | None:
        async with self.db.transaction(readonly=True) as tx:
            row = await tx.fetchone("SELECT state FROM fleet_nodes WHERE name = ?", name)
        return NodeState(row[0]) if row is not None else None

    async def node_names(self) -> list[str]:
        async with self.db.transaction(readonly=True) as tx:
            rows = await tx.fetch("SELECT name FROM fleet_nodes ORDER BY name")
        return [str(r[0]) for r in rows]

    async def metrics_urls(self, names: Iterable[str]) -> dict[str, str]:
        """The agent metrics URL (NodeInventory.metrics_url, "" when it serves none) of each
        named node that has a row, read in chunks of NAMES_PER_READ."""
        wanted = sorted(set(names))
        found: dict[str, str] = {}
        async with self.db.transaction(readonly=True) as tx:
            for at in range(0, len(wanted), NAMES_PER_READ):
                chunk = wanted[at : at + NAMES_PER_READ]
                marks = ", ".join("?" * len(chunk))
                rows = await tx.fetch(
                    f"SELECT name, record FROM fleet_nodes WHERE name IN ({marks})",  # noqa: S608
                    *chunk,
                )
                for name, record in rows:
                    inventory = json.loads(record).get("inventory", {})
                    found[str(name)] = str(inventory.get("metrics_url", ""))
        return found

    async def load_nodes(self, names: Iterable[str]) -> list[NodeLoad]:
        """Each node's row and every allocation with a shard on it, read together."""
        loads: list[NodeLoad] = []
        async with self.db.transaction(readonly=True) as tx:
            for name in names:
                row = await tx.fetchone("SELECT record, rev FROM fleet_nodes WHERE name = ?", name)
                docs = await tx.fetch(
                    "SELECT doc FROM fleet_allocations WHERE replica_id IN "
                    "(SELECT replica_id FROM fleet_claims WHERE node = ?)",
                    name,
                )
                node = None
                if row is not None:
                    record = NodeRecord.model_validate_json(row[0])
                    node = NodeRow(record, int(row[1]))
                allocations = [Allocation.model_validate_json(d[0]) for d in docs]
                loads.append(NodeLoad(name, node, allocations))
        return loads

    # --- allocations ----------------------------------------------------------------------

    async def allocations(self) -> dict[str, Allocation]:
        async with self.db.transaction(readonly=True) as tx:
            rows = await tx.fetch("SELECT doc FROM fleet_allocations")
        found = (Allocation.model_validate_json(r[0]) for r in rows)
        return {a.replica_id: a for a in found}

    async def allocation(self, replica_id: str) -> Allocation | None:
        async with self.db.transaction(readonly=True) as tx:
            row = await tx.fetchone(
                "SELECT doc FROM fleet_allocations WHERE replica_id = ?", replica_id
            )
        return Allocation.model_validate_json(row[0]) if row is not None else None

    async def commit_placement(self, alloc: Allocation, revs: dict[str, int], writer: str) -> None:
        """Record an allocation that placer `writer` decided on nodes as it read them at the
        revs given ({node: rev}). A node still at that rev, or written last by the same placer
        (whose memory holds what it wrote, in whatever order its commits land), has not changed
        under the decision. Conflict when any node has, when the replica holds an allocation
        already, or when any port or GPU is held: then nothing is written."""
        async with self.db.transaction() as tx:
            for node, seen in sorted(revs.items()):
                changed = await tx.execute(
                    "UPDATE fleet_nodes SET rev = ?, writer = ? "
                    "WHERE name = ? AND (rev = ? OR writer = ?)",
                    new_rev(),
                    writer,
                    node,
                    seen,
                    writer,
                )
                if changed != 1:
                    raise Conflict(f"node {node} changed since placement read it")
            await _insert_allocation(tx, alloc)

    async def release(self, replica_id: str) -> bool:
        """Free a replica's allocation and withdraw its route; False when it held neither."""
        async with self.db.transaction() as tx:
            nodes = await tx.fetch(
                "SELECT DISTINCT node FROM fleet_claims WHERE replica_id = ?", replica_id
            )
            freed = await tx.execute(
                "DELETE FROM fleet_allocations WHERE replica_id = ?", replica_id
            )
            await tx.execute("DELETE FROM fleet_claims WHERE replica_id = ?", replica_id)
            for (node,) in nodes:
                await tx.execute(
                    "UPDATE fleet_nodes SET rev = ?, writer = '' WHERE name = ?", new_rev(), node
                )
            withdrawn = await _withdraw(tx, replica_id)
        return bool(freed) or withdrawn

    async def replicas_on(self, node: str) -> list[ReplicaRef]:
        async with self.db.transaction(readonly=True) as tx:
            rows = await tx.fetch(
                "SELECT replica_id, workflow_id, model FROM fleet_allocations WHERE replica_id "
                "IN (SELECT replica_id FROM fleet_claims WHERE node = ?) ORDER BY replica_id",
                node,
            )
        return [ReplicaRef(replica_id=r[0], workflow_id=r[1], model=r[2]) for r in rows]

    # --- routes ---------------------------------------------------------------------------

    async def set_route(self, route: Route) -> bool:
        """Publish a replica's route (STOPPED withdraws it). A replica saying again what it
        said writes nothing and sends gateways nothing; True when the route changed."""
        route = stored_route(route)
        async with self.db.transaction() as tx:
            if route.state == ReplicaState.STOPPED:
                return await _withdraw(tx, route.replica_id)
            doc = route.model_dump_json()
            before = await tx.fetchone(
                f"SELECT doc FROM fleet_routes WHERE replica_id = ?{self._select_for_update}",  # noqa: S608
                route.replica_id,
            )
            if before is not None and before[0] == doc:
                return False
            version = await _next_version(tx)
            if before is None:
                await tx.execute(
                    "INSERT INTO fleet_routes (replica_id, model, node, version, doc) "
                    "VALUES (?, ?, ?, ?, ?)",
                    route.replica_id,
                    route.model,
                    route.node,
                    version,
                    doc,
                )
            else:
                await tx.execute(
                    "UPDATE fleet_routes SET model = ?, node = ?, version = ?, doc = ? "
                    "WHERE replica_id = ?",
                    route.model,
                    route.node,
                    version,
                    doc,
                    route.replica_id,
                )
        return True

    async def set_idle(self, model: str, idle: bool) -> bool:
        """Mark a model scaled to zero (gateways wake it) or not; True when that changed."""
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                f"SELECT value FROM fleet_meta WHERE name = ?{self._select_for_update}",  # noqa: S608
                schema.IDLE_MODELS,
            )
            before = set(json.loads(row[0])) if row is not None else set()
            after = before | {model} if idle else before - {model}
            if after == before:
                return False
            await tx.execute(
                "UPDATE fleet_meta SET value = ? WHERE name = ?",
                json.dumps(sorted(after)),
                schema.IDLE_MODELS,
            )
            await _next_version(tx)
        return True

    async def routing_table(self, held: RoutingTableRequest | None = None) -> RoutingTable:
        """What a gateway holding `held` (epoch and version) needs: `unchanged` when nothing
        changed (one indexed read), the routes changed and the ids removed since its version
        when the tombstones reach back that far, else the whole table. Routes are served as
        their nodes' states say (routes.served_route)."""
        async with self.db.transaction(readonly=True) as tx:
            meta = _pairs(await tx.fetch("SELECT name, value FROM fleet_meta"))
            counters = _pairs(await tx.fetch("SELECT name, value FROM fleet_counters"))
            epoch = str(meta[schema.EPOCH])
            version = int(counters[schema.ROUTE_VERSION])
            floor = int(counters[schema.ROUTE_FLOOR])
            idle = list(json.loads(meta[schema.IDLE_MODELS]))
            same_epoch = held is not None and held.epoch == epoch
            if held is not None and same_epoch and held.version == version:
                return RoutingTable(version=version, epoch=epoch, unchanged=True)
            select = (
                "SELECT r.replica_id, r.doc, n.state FROM fleet_routes r "
                "LEFT JOIN fleet_nodes n ON n.name = r.node"
            )
            if held is not None and same_epoch and floor <= held.version < version:
                rows = await tx.fetch(f"{select} WHERE r.version > ?", held.version)
                routes, removed = _served(rows)
                return RoutingTable(
                    version=version,
                    epoch=epoch,
                    delta=True,
                    since=held.version,
                    routes=routes,
                    removed=removed,
                    idle_models=idle,
                )
            rows = await tx.fetch(f"{select} WHERE r.doc IS NOT NULL")
        routes, _ = _served(rows)
        return RoutingTable(version=version, epoch=epoch, routes=routes, idle_models=idle)

    async def model_routes(self, model: str) -> list[Route]:
        async with self.db.transaction(readonly=True) as tx:
            rows = await tx.fetch(
                "SELECT r.replica_id, r.doc, n.state FROM fleet_routes r "
                "LEFT JOIN fleet_nodes n ON n.name = r.node "
                "WHERE r.model = ? AND r.doc IS NOT NULL",
                model,
            )
        return _served(rows)[0]

    async def snapshot(self) -> LedgerState:
        """Nodes, allocations, routes (as their replicas wrote them) and idle models, read in
        one snapshot: what `llmgw nodes`, `status`, the console and `top` show."""
        async with self.db.transaction(readonly=True) as tx:
            nodes = await tx.fetch("SELECT record, rev FROM fleet_nodes")
            allocs = await tx.fetch("SELECT doc FROM fleet_allocations")
            routes = await tx.fetch("SELECT doc FROM fleet_routes WHERE doc IS NOT NULL")
            meta = _pairs(await tx.fetch("SELECT name, value FROM fleet_meta"))
            counters = _pairs(await tx.fetch("SELECT name, value FROM fleet_counters"))
        state = LedgerState(
            nodes={r.inventory.name: r for r, _ in _records(nodes)},
            idle_models=list(json.loads(meta[schema.IDLE_MODELS])),
            version=int(counters[schema.ROUTE_VERSION]),
        )
        for (doc,) in allocs:
            alloc = Allocation.model_validate_json(doc)
            state.allocations[alloc.replica_id] = alloc
        for (doc,) in routes:
            route = Route.model_validate_json(doc)
            state.routes[route.replica_id] = route
        return state

    async def replace_all(self, state: LedgerState) -> None:
        """Make the tables hold exactly `state`'s allocations and routes (`llmgw ledger
        rebuild`, from the workflows that own them); nodes are left as their workflows wrote
        them. Gateways see every route at a new version."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM fleet_claims")
            await tx.execute("DELETE FROM fleet_allocations")
            for alloc in state.allocations.values():
                # Two replicas holding one port or GPU in their workflows fail the rebuild
                # (Conflict, naming it), rather than one of them being dropped unseen.
                await _insert_allocation(tx, alloc)
            await tx.execute("UPDATE fleet_nodes SET rev = rev + 1, writer = ''")
            version = await _next_version(tx)
            await tx.execute("UPDATE fleet_routes SET doc = NULL, version = ?", version)
            for route in state.routes.values():
                route = stored_route(route)
                await tx.execute(
                    "INSERT INTO fleet_routes (replica_id, model, node, version, doc) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (replica_id) DO UPDATE SET "
                    "model = excluded.model, node = excluded.node, version = excluded.version, "
                    "doc = excluded.doc",
                    route.replica_id,
                    route.model,
                    route.node,
                    version,
                    route.model_dump_json(),
                )


def _records(rows: Sequence[Row]) -> list[tuple[NodeRecord, int]]:
    return [(NodeRecord.model_validate_json(r[0]), int(r[1])) for r in rows]


def _pairs(rows: Sequence[Row]) -> dict[str, Any]:
    return {str(r[0]): r[1] for r in rows}


def _served(rows: Sequence[Row]) -> tuple[list[Route], list[str]]:
    """(replica_id, doc, node state) rows: the routes as served, and the ids withdrawn."""
    routes: list[Route] = []
    removed: list[str] = []
    for replica_id, doc, node_state in rows:
        if doc is None:
            removed.append(str(replica_id))
        else:
            routes.append(served_route(Route.model_validate_json(doc), node_state))
    return routes, removed


async def _insert_allocation(tx: Tx, alloc: Allocation) -> None:
    """The allocation's row and one claim row per port and GPU it holds; Conflict when the
    replica has an allocation already or another holds one of them."""
    await tx.execute(
        "INSERT INTO fleet_allocations (replica_id, model, workflow_id, doc) VALUES (?, ?, ?, ?)",
        alloc.replica_id,
        alloc.model,
        alloc.workflow_id,
        alloc.model_dump_json(),
    )
    for node, item in claims(alloc):
        await tx.execute(
            "INSERT INTO fleet_claims (node, item, replica_id) VALUES (?, ?, ?)",
            node,
            item,
            alloc.replica_id,
        )


async def _next_version(tx: Tx) -> int:
    """The next route version. The counter's row stays locked until this transaction ends,
    so route changes commit in version order: a gateway that read version v has seen every
    change up to v."""
    row = await tx.fetchone(
        "UPDATE fleet_counters SET value = value + 1 WHERE name = ? RETURNING value",
        schema.ROUTE_VERSION,
    )
    assert row is not None, "the fleet tables were not created"
    version = int(row[0])
    if version % PRUNE_EVERY == 0 and version > KEEP_VERSIONS:
        floor = version - KEEP_VERSIONS
        await tx.execute("DELETE FROM fleet_routes WHERE doc IS NULL AND version <= ?", floor)
        await tx.execute(
            "UPDATE fleet_counters SET value = ? WHERE name = ?", floor, schema.ROUTE_FLOOR
        )
    return version


async def _withdraw(tx: Tx, replica_id: str) -> bool:
    """Leave a tombstone where the replica's route was; False when it had none."""
    row = await tx.fetchone(
        "SELECT doc FROM fleet_routes WHERE replica_id = ? AND doc IS NOT NULL", replica_id
    )
    if row is None:
        return False
    version = await _next_version(tx)
    await tx.execute(
        "UPDATE fleet_routes SET doc = NULL, version = ? WHERE replica_id = ?", version, replica_id
    )
    return True
