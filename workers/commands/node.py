"""`llmgw nodes` and `llmgw node add|cordon|uncordon|drain|rm|show`.

The operator commands are signals on the node's workflow, so
`temporal workflow signal --workflow-id node:NAME --name drain --input '{"reason": "..."}'`
does exactly what `llmgw node drain NAME` does; this command then shows what the node did.
"""

import argparse
import asyncio
from collections import Counter

from temporalio.client import Client
from temporalio.service import RPCError

from activities.control.node_admin import add_node, node_handle
from store import open_store
from store.fleet import FleetTables
from workers.commands.node_bootstrap import add_bootstrap_parser
from workers.join import JoinToken
from workers.node_telemetry import gpu_headline, node_warnings, read_agents
from workers.paths import Locations
from workers.progress import engine_lines, ledger_snapshot
from workers.tables import table
from workflows.contracts import (
    EngineState,
    LedgerState,
    NodeAdd,
    NodeCommand,
    NodeInventory,
    NodeRecord,
    NodeState,
    NodeView,
)
from workflows.engine_keys import node_secret
from workflows.names import reserved_node_name
from workflows.node.proof import identity_key
from workflows.node.workflow import NodeWorkflow
from workflows.placement.disk import size_text

# How long a command waits to see the node take it before saying it was only sent.
SEEN_WITHIN_S = 10.0
# Each operator command's signal on the node workflow (`rm` is its `remove`).
NODE_SIGNALS = {
    "cordon": NodeWorkflow.cordon,
    "uncordon": NodeWorkflow.uncordon,
    "drain": NodeWorkflow.drain,
    "rm": NodeWorkflow.remove,
}


def parse_labels(values: list[str]) -> dict[str, str]:
    labels = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"--label wants KEY=VALUE, got {value!r}")
        labels[key] = label
    return labels


def gpu_summary(record: NodeRecord) -> str:
    usable = Counter(g.gpu_class for g in record.inventory.gpus if not g.unusable)
    text = ", ".join(f"{n}x {cls}" for cls, n in sorted(usable.items())) or "none"
    unusable = sum(1 for g in record.inventory.gpus if g.unusable)
    return text + (f" (+{unusable} unusable)" if unusable else "")


def why_not_placeable(record: NodeRecord) -> list[str]:
    """Everything that keeps replicas off this node, in words; empty when it takes them."""
    reasons = []
    if record.state != NodeState.READY:
        reasons.append(record.state.value + (f": {record.note}" if record.note else ""))
    elif record.cordoned:
        kind = "draining" if record.draining else "cordoned"
        reasons.append(kind + (f": {record.note}" if record.note else ""))
    if not any(s.state == EngineState.INSTALLED for s in record.engines.values()):
        states = ", ".join(f"{s.engine} {s.state.value}" for s in record.engines.values())
        reasons.append(f"no engine can run here ({states})" if states else "no engine yet")
    for gpu in record.inventory.gpus:
        if gpu.unusable:
            reasons.append(f"GPU {gpu.index} ({gpu.gpu_class}): {gpu.unusable}")
    reasons.extend(record.inventory.problems)
    return reasons


async def show_nodes(client: Client, fleet: FleetTables) -> None:
    state = await ledger_snapshot(fleet)
    rows = []
    notes: list[str] = []
    unread: list[str] = []
    warnings: list[str] = []
    telemetry = await read_agents(
        {name: record.inventory.metrics_url for name, record in state.nodes.items()}
    )
    for name, record in sorted(state.nodes.items()):
        inv = record.inventory
        flags = "avx2" if "avx2" in inv.cpu_flags else "NO AVX2"
        cpus = f"{inv.cpu_cores} ({flags})" if inv.cpu_cores else "-"
        engines = "; ".join(await engine_lines(client, record)) or "none"
        why = why_not_placeable(record)
        figures = telemetry[name]
        if isinstance(figures, str):
            now = "?" if inv.gpus else "-"
            if inv.gpus:  # a CPU node has no GPU figures to miss
                unread.append(f"  {name}: {figures}")
        else:
            now = gpu_headline(figures.cards())
            warnings.extend(f"  {name}: {w}" for w in node_warnings(figures))
        rows.append(
            [
                name,
                record.state.value,
                cpus,
                str(inv.memory_mb or "-"),
                gpu_summary(record),
                now,
                engines,
                "yes" if not why else "no",
            ]
        )
        notes.extend(f"  {name}: {reason}" for reason in why)
    headers = ["NODE", "STATE", "CPUS", "MEMORY MB", "GPUS", "GPU NOW", "ENGINES", "PLACEABLE"]
    print(table(headers, rows))
    if notes:
        print("\nnot placeable because:")
        print("\n".join(notes))
    if warnings:
        print("\nGPU warnings:")
        print("\n".join(warnings))
    if unread:
        print("\nno GPU figures from:")
        print("\n".join(unread))


async def show_node(client: Client, name: str) -> None:
    view = await describe(client, name)
    if view is None:
        raise SystemExit(f"no node {name!r}")
    record = view.record
    print(f"node {name}: {record.state.value}" + (f" ({record.note})" if record.note else ""))
    for line in inventory_lines(record.inventory, record.labels):
        print(f"  {line}")
    for line in await engine_lines(client, record):
        print(f"  engine    {line}")
    if view.draining_replicas:
        print(f"  moving    {', '.join(view.draining_replicas)}")
    for reason in why_not_placeable(record):
        print(f"  not placeable: {reason}")


def inventory_lines(inv: NodeInventory, labels: dict[str, str]) -> list[str]:
    """The machine as placement reads it, one fact a line: `llmgw node show` and, on the node
    itself, `llmgw agent inventory`."""
    lines = [
        f"machine   {inv.hostname} {inv.address} {inv.os} {inv.arch}",
        f"cpu       {inv.cpu_cores} cores, {inv.cpu_model}, flags {' '.join(inv.cpu_flags)}",
        f"memory    {inv.memory_mb} MB",
        f"driver    {inv.nvidia_driver or '-'} (CUDA {inv.cuda_version or '-'})",
        f"labels    {', '.join(f'{k}={v}' for k, v in sorted(labels.items())) or '-'}",
        f"artifacts {artifacts_line(inv)}",
    ]
    for gpu in inv.gpus:
        where = f" fabric {gpu.fabric.domain}" if gpu.fabric and gpu.fabric.domain else ""
        problem = f" UNUSABLE: {gpu.unusable}" if gpu.unusable else ""
        lines.append(f"gpu {gpu.index:<5} {gpu.gpu_class} {gpu.uuid}{where}{problem}")
    for port in inv.network_ports:
        lines.append(
            f"{port.kind:<10} {port.device}:{port.port} {port.state} {port.rate_gbps:g} Gb/s"
        )
    return lines


def artifacts_line(inv: NodeInventory) -> str:
    """The mirror's artifacts the node holds and its disk for more, as placement reads them."""
    free = inv.artifact_disk_free_mb
    room = "free disk not reported" if free is None else f"{size_text(free)} free for more"
    return f"{len(inv.artifacts)} held, {room}"


async def describe(client: Client, name: str) -> NodeView | None:
    try:
        return await node_handle(client, name).query(NodeWorkflow.describe)
    except RPCError:
        return None


async def node_add(client: Client, where: Locations, args: argparse.Namespace) -> None:
    """Expect a node and print its join token (the only time the token is shown)."""
    reserved = reserved_node_name(args.name)
    if reserved is not None:
        raise SystemExit(reserved)
    store = open_store(where.database_url, where.state_dir)
    await store.init()
    try:
        master = await store.master_secret()
    finally:
        await store.close()
    secret = node_secret(master, args.name)
    req = NodeAdd(
        name=args.name,
        address=args.address or "",
        labels=parse_labels(args.label),
        identity=identity_key(secret),
        disable_engines=args.disable_engine,
        enable_engines=args.enable_engine,
    )
    view = await add_node(client, req)
    token = JoinToken(node=args.name, temporal=args.join_address or where.temporal, secret=secret)
    if view.disabled_engines:
        print(f"node {args.name}: engines kept off: {', '.join(view.disabled_engines)}")
    print(f"node {args.name}: {view.record.state.value}. On that machine run:")
    print(f"  llmgw agent --join {token.encode()}")
    print("The token opens this node's engines: pass it as a secret, not in a ticket.")


class NodeCommandRefused(Exception):
    """A node command that was not sent, with why (no such node, replicas still on it)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing  # no such node (or command)


async def send_node_command(
    client: Client,
    fleet: FleetTables,
    name: str,
    action: str,
    reason: str = "",
    force: bool = False,
) -> tuple[bool, list[str]]:
    """Signal `action` (cordon, uncordon, drain, rm) on the node's workflow after the checks
    every caller gets (the CLI and the web console's admin API alike), and wait a little to see
    the ledger take it. Returns whether it was seen taken, and the replicas on the node then."""
    if action not in NODE_SIGNALS:
        raise NodeCommandRefused(f"no node command {action!r}", missing=True)
    view = await describe(client, name)
    if view is None or view.record.state == NodeState.REMOVED:
        raise NodeCommandRefused(f"no node {name!r}", missing=True)
    state = await ledger_snapshot(fleet)
    here = sorted(a.replica_id for a in state.allocations.values() if a.node == name)
    if action == "rm" and here and not force and view.record.state != NodeState.LOST:
        raise NodeCommandRefused(
            f"node {name} still runs {', '.join(here)}: `llmgw node drain "
            f"{name}` first, or rm --force to stop them now (requests to them fail)"
        )
    signal = NODE_SIGNALS[action]
    await node_handle(client, name).signal(signal, NodeCommand(reason=reason))
    return await _seen(fleet, name, action), here


async def node_signal(client: Client, fleet: FleetTables, args: argparse.Namespace) -> None:
    try:
        seen, here = await send_node_command(
            client, fleet, args.name, args.action, args.reason or "", getattr(args, "force", False)
        )
    except NodeCommandRefused as err:
        raise SystemExit(str(err)) from None
    status = "done" if seen else "sent (the control worker has not taken it yet)"
    print(f"node {args.name}: {args.action} {status}")
    if args.action == "drain" and here:
        print(f"moving {', '.join(here)}; `llmgw node show {args.name}` shows progress")


async def _seen(fleet: FleetTables, name: str, action: str) -> bool:
    """Wait until the fleet tables reflect the command."""

    def done(state: LedgerState) -> bool:
        record = state.nodes.get(name)
        if action == "rm":
            return record is None
        if record is None:
            return False
        if action == "uncordon":
            return not record.cordoned
        if action == "drain":
            return record.draining or record.note == "drained"
        return record.cordoned

    loop = asyncio.get_running_loop()
    deadline = loop.time() + SEEN_WITHIN_S
    while loop.time() < deadline:
        if done(await ledger_snapshot(fleet)):
            return True
        await asyncio.sleep(0.2)
    return False


def add_node_parsers(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]", common: argparse.ArgumentParser
) -> None:
    node = sub.add_parser("node", help="add, cordon, drain and remove nodes")
    nsub = node.add_subparsers(dest="action", required=True)
    add = nsub.add_parser("add", parents=[common], help="expect a node; prints its join token")
    add.add_argument("name")
    add.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    add.add_argument("--address", help="the node's address, if known before it joins")
    add.add_argument(
        "--join-address", help="the Temporal address as the node reaches it (default --temporal)"
    )
    add.add_argument(
        "--disable-engine",
        action="append",
        default=[],
        metavar="ENGINE",
        help="keep this engine off the node, whatever the engines config says (repeatable)",
    )
    add.add_argument(
        "--enable-engine",
        action="append",
        default=[],
        metavar="ENGINE",
        help="give back an engine --disable-engine kept off (repeatable)",
    )
    show = nsub.add_parser("show", parents=[common], help="one node in detail")
    show.add_argument("name")
    for action, text in (
        ("cordon", "no new replicas on the node"),
        ("uncordon", "take replicas again"),
        ("drain", "cordon, then move every replica elsewhere, each after its successor serves"),
        ("rm", "remove the node from the cluster"),
    ):
        cmd = nsub.add_parser(action, parents=[common], help=text)
        cmd.add_argument("name")
        cmd.add_argument("--reason", help="shown in `llmgw nodes`")
        if action == "rm":
            cmd.add_argument("--force", action="store_true", help="even with replicas on it")
    add_bootstrap_parser(nsub)


async def node_command(
    client: Client, fleet: FleetTables, where: Locations, args: argparse.Namespace
) -> None:
    if args.action == "add":
        await node_add(client, where, args)
    elif args.action == "show":
        await show_node(client, args.name)
    else:
        await node_signal(client, fleet, args)
