"""The operator's commands: status, nodes, models, keys and usage, printed as tables."""

import argparse
from datetime import datetime
from pathlib import Path

from temporalio.client import Client

from gateway.store import KeyNameTaken, Store, open_store
from workers.connect import connect_with_retry
from workers.model_commands import model_command
from workers.node_commands import node_command, show_nodes
from workers.paths import Locations
from workers.progress import ledger_snapshot
from workers.tables import table
from workflows.model_client import list_models


def absolute(path: str) -> str:
    """A path on a command line is relative to where the operator stands, not to the agent."""
    return str(Path(path).expanduser().absolute())


async def run_command(args: argparse.Namespace, where: Locations, expires: datetime | None) -> None:
    if args.command in ("key", "usage"):
        store = open_store(where.database_url, where.state_dir)
        await store.init()
        try:
            await store_command(args, store, expires)
        finally:
            await store.close()
        return
    try:
        client = await connect_with_retry(where, attempts=3)
    except RuntimeError as err:
        raise SystemExit(
            f"cannot reach Temporal at {where.temporal}: is `llmgw up` running? ({err})"
        ) from None
    if args.command == "status":
        await status(client)
    elif args.command == "nodes":
        await show_nodes(client)
    elif args.command == "node":
        await node_command(client, where, args)
    elif args.command == "model":
        await model_command(args, client)


async def status(client: Client) -> None:
    await show_nodes(client)
    state = await ledger_snapshot(client)
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


async def store_command(args: argparse.Namespace, store: Store, expires: datetime | None) -> None:
    if args.command == "usage":
        key_id = None
        if args.key:
            keys = [k for k in await store.list_keys() if args.key in (k.name, k.key_id)]
            if not keys:
                raise SystemExit(f"no key {args.key!r}")
            key_id = keys[0].key_id
        names = {k.key_id: k.name for k in await store.list_keys()}
        rows = [
            [
                str(u.day),
                names.get(u.key_id, u.key_id),
                u.model,
                str(u.requests),
                str(u.prompt_tokens),
                str(u.completion_tokens),
            ]
            for u in await store.usage(key_id=key_id, model=args.model)
        ]
        print(table(["DAY", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION"], rows))
    elif args.action == "create":
        models = [m.strip() for m in args.models.split(",")] if args.models else None
        try:
            record, secret = await store.create_key(args.name, models=models, expires_at=expires)
        except KeyNameTaken as err:
            raise SystemExit(str(err)) from None
        print(f"key {record.name} ({record.key_id}) created; it is shown only this once:")
        print(secret)
    elif args.action == "list":
        rows = [
            [
                k.name,
                k.key_id,
                ",".join(k.models) if k.models else "all",
                k.created_at.strftime("%Y-%m-%d %H:%M"),
                k.expires_at.strftime("%Y-%m-%d %H:%M") if k.expires_at else "-",
                "revoked" if k.revoked_at else "active",
            ]
            for k in await store.list_keys()
        ]
        print(table(["NAME", "ID", "MODELS", "CREATED", "EXPIRES", "STATE"], rows))
    elif args.action == "revoke":
        if not await store.revoke_key(args.name_or_id):
            raise SystemExit(f"no active key {args.name_or_id!r}")
        print(f"revoked {args.name_or_id}")
