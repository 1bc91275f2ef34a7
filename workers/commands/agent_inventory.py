"""`llmgw agent inventory`: on the node itself, what the scheduler would see if this machine
joined now, with no control plane and nothing started. The same discovery the agent registers
with (activities/agent/machine_inventory.py), its engines as installed in the state dir, and
what would keep replicas off it."""

import argparse
import json
from pathlib import Path

from activities.agent.machine_inventory import installed_engines, machine_inventory
from workers.commands.node import inventory_lines, parse_labels, why_not_placeable
from workflows.contracts import NodeRecord, NodeState


def node_as_scheduled(
    node: str, address: str, state_dir: Path, labels: dict[str, str], engine_paths: dict[str, str]
) -> NodeRecord:
    """This machine as a ready node's record: its inventory, installed engines and labels."""
    inventory = machine_inventory(node, address, state_dir / "artifacts")
    engines = installed_engines(state_dir / "engines", engine_paths)
    return NodeRecord(
        inventory=inventory,
        state=NodeState.READY,
        labels=labels,
        engines={status.engine: status for status in engines},
    )


def report_lines(record: NodeRecord) -> list[str]:
    lines = [f"node {record.inventory.name}, as the scheduler would see it:"]
    lines += [f"  {line}" for line in inventory_lines(record.inventory, record.labels)]
    for status in record.engines.values():
        lines.append(f"  engine    {status.engine} {status.version} at {status.path}")
    if not record.engines:
        lines.append("  engine    none installed in this state dir (the agent installs them)")
    reasons = why_not_placeable(record)
    lines += [f"  not placeable: {reason}" for reason in reasons]
    if not reasons:
        lines.append("  placeable: yes")
    lines.append("Engines are listed from their install markers; `llmgw doctor` runs them.")
    return lines


def run(args: argparse.Namespace, state_dir: Path, engine_paths: dict[str, str]) -> None:
    record = node_as_scheduled(
        args.node, args.address, state_dir, parse_labels(args.label), engine_paths
    )
    if args.json:
        print(json.dumps(record.model_dump(mode="json"), indent=2))
        return
    print("\n".join(report_lines(record)))
