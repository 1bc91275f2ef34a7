"""The Temporal CLI commands the docs give operators, run through the `temporal` binary as they
are printed there (docs/nodes.md, docs/operations.md), against a real dev server: each node
signal by its name with a JSON reason, and the replica's `describe` query. Only the server's
address and namespace are added, as `temporal env` or flags would on an operator's machine."""

import asyncio
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from temporalio.worker import Worker

from tests.workflows.conftest import Cluster, binary, eventually, finished
from tests.workflows.test_node import ledger_record, register, registration, wait_for_node
from tests.workflows.test_node_ops import serving_model
from workers.control import control_activities
from workers.registry import CONTROL_WORKFLOWS
from workflows.contracts import EngineState, NodeRecord, NodeState, NodeView
from workflows.names import CONTROL_TASK_QUEUE, node_workflow_id, replica_id, replica_workflow_id
from workflows.node.workflow import CORDON, DRAIN, REMOVE, UNCORDON

DOCS = Path(__file__).parents[2] / "docs"


def documented(page: str, command: str) -> list[str]:
    """The first line of `page` that runs `command`, split as a shell would."""
    text = (DOCS / page).read_text()
    found = re.search(rf"^{re.escape(command)} .*$", text, re.MULTILINE)
    if found is None:  # `...` quoted inline, as operations.md does
        found = re.search(rf"`({re.escape(command)} [^`]*)`", text)
        assert found is not None, f"{page} documents no `{command}`"
        return shlex.split(found.group(1))
    return shlex.split(found.group(0))


def signal_names_documented() -> list[str]:
    """The node signals docs/nodes.md names for the CLI."""
    found = re.search(r"The signal names are (.*?)\.", (DOCS / "nodes.md").read_text(), re.DOTALL)
    assert found is not None, "nodes.md no longer lists the node signals"
    names = re.sub(r"\(.*?\)", "", found.group(1))  # "(the CLI's `rm`)"
    return re.findall(r"`(\w+)`", names)


def with_values(argv: list[str], **values: str) -> list[str]:
    """argv with the value after each `--flag` named in values (underscores for dashes)
    replaced."""
    out = list(argv)
    for flag, value in values.items():
        at = out.index("--" + flag.replace("_", "-"))
        out[at + 1] = value
    return out


async def temporal(cluster: Cluster, argv: list[str]) -> str:
    """Run a documented `temporal ...` command line against the test's server; its stdout."""
    target = cluster.client.service_client.config.target_host
    where = ["--address", target, "--namespace", cluster.client.namespace]
    process = await asyncio.create_subprocess_exec(
        binary("temporal"),
        *argv[1:],
        *where,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, f"{shlex.join(argv)}: {err.decode()}"
    return out.decode()


async def record_shows(
    cluster: Cluster, what: str, check: Callable[[NodeRecord], bool]
) -> NodeRecord:
    async def there() -> bool:
        record = await ledger_record(cluster)
        return record is not None and check(record)

    there.__doc__ = what
    await eventually(there, timeout=30)
    record = await ledger_record(cluster)
    assert record is not None
    return record


async def test_the_documented_node_signals_and_replica_query_work_from_the_temporal_cli(
    dev_cluster: Cluster, server_config: Path
) -> None:
    cluster = dev_cluster
    # Agents start their node's workflow on the shared control queue: served here too.
    activities = control_activities(cluster.client, cluster.fleet, server_config)
    shared = CONTROL_TASK_QUEUE
    async with Worker(
        cluster.client, task_queue=shared, workflows=CONTROL_WORKFLOWS, activities=activities
    ):
        await node_signals_and_replica_query(cluster)


async def node_signals_and_replica_query(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    signal = documented("nodes.md", "temporal workflow signal")
    assert signal_names_documented() == [CORDON, UNCORDON, DRAIN, REMOVE]

    async def send(name: str, reason: str) -> None:
        reasons = json.dumps({"reason": reason})
        argv = with_values(
            signal, workflow_id=node_workflow_id(cluster.node), name=name, input=reasons
        )
        await temporal(cluster, argv)

    await send(CORDON, "kernel upgrade")
    record = await record_shows(cluster, "cordoned", lambda r: r.cordoned)
    assert record.note == "kernel upgrade"

    await send(UNCORDON, "")
    await record_shows(cluster, "uncordoned", lambda r: not r.cordoned)

    # The documented line itself, only the node's name changed.
    await temporal(cluster, with_values(signal, workflow_id=node_workflow_id(cluster.node)))
    record = await record_shows(cluster, "drained", lambda r: r.note == "drained")
    assert record.cordoned
    assert not record.draining
    await send(UNCORDON, "")
    await record_shows(cluster, "placeable again", lambda r: not r.cordoned)

    # A replica's view, as "A model never becomes ready" in operations.md asks for it.
    model = await serving_model(cluster)
    query = documented("operations.md", "temporal workflow query")
    argv = with_values(query, workflow_id=replica_workflow_id(model, 0))
    shown = await temporal(cluster, [*argv, "--output", "json"])
    assert replica_id(model, 0) in shown
    assert '"ready"' in shown, shown

    await send(REMOVE, "decommissioned")
    view = await finished(cluster.client, node_workflow_id(cluster.node), NodeView)
    assert view is not None
    assert view.record.state == NodeState.REMOVED
    assert view.record.note == "decommissioned"
    assert cluster.node not in (await cluster.ledger()).nodes
