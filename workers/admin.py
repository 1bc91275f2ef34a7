"""The operator's commands that go through Temporal: status, nodes and models, printed as
tables, and the live console `top`. Keys, usage and the store itself are in
workers/commands/store.py."""

import argparse
from pathlib import Path

from temporalio.client import Client

from store.fleet import FleetTables
from workers.commands.engine import run_engine_command
from workers.commands.model import model_command
from workers.commands.node import node_command, show_nodes
from workers.connect import connect_with_retry
from workers.fetch_progress import fetches_table, running_fetches, show_fetches
from workers.paths import Locations
from workers.progress import fleet_tables, ledger_snapshot
from workers.tables import table
from workflows.model.client import list_models


def absolute(path: str) -> str:
    """A path on a command line is relative to where the operator stands, not to the agent."""
    return str(Path(path).expanduser().absolute())


async def run_command(args: argparse.Namespace, where: Locations) -> None:
    try:
        client = await connect_with_retry(where, attempts=3)
    except RuntimeError as err:
        raise SystemExit(
            f"cannot reach Temporal at {where.temporal}: is `llmgw up` running? ({err})"
        ) from None
    fleet = await fleet_tables(where)
    if args.command == "status":
        await status(client, fleet)
    elif args.command == "nodes":
        await show_nodes(client, fleet)
    elif args.command == "fetches":
        await show_fetches(client)
    elif args.command == "node":
        await node_command(client, fleet, where, args)
    elif args.command == "engine":
        await run_engine_command(client, args)
    elif args.command == "model":
        await model_command(args, client, where, fleet)
    elif args.command == "top":
        from workers.top.console import run_console
        from workers.top.operate import LiveOperator
        from workers.top.source import CatalogReader, LiveSource

        catalog = CatalogReader(client, where.mirror_dir)
        operator = LiveOperator(client, fleet, where, args.ollama_store)
        await run_console(LiveSource(client, fleet, args.admin, catalog), args.every, operator)


async def status(client: Client, fleet: FleetTables) -> None:
    await show_nodes(client, fleet)
    fetches = await running_fetches(client)
    if fetches:
        print()
        print(fetches_table(fetches))
    state = await ledger_snapshot(fleet)
    current = {v.spec.name: set(v.spec.fingerprints()) for v in await list_models(client)}
    print()
    rows = [
        [
            r.replica_id,
            r.model,
            r.state.value,
            r.node,
            r.endpoint,
            # A replica started from a profile the catalog has since changed: a rolling update
            # replaces it once it serves.
            "stale" if r.fingerprint and r.fingerprint not in current.get(r.model, set()) else "",
            r.detail,
        ]
        for r in sorted(state.routes.values(), key=lambda r: r.replica_id)
    ]
    print(table(["REPLICA", "MODEL", "STATE", "NODE", "ENDPOINT", "PROFILE", "DETAIL"], rows))
