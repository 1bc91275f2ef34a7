"""`llmgw agent`: one per machine. Registers the node, holds its liveness watch (heartbeats to
Temporal that cost the node workflow no history: activities/agent/liveness.py), and runs the
node's activities (installs, engine processes) on its own task queue. With a KV feed port, it also
serves its engines' KV-cache events to gateways (activities/agent/kv/service.py).

Engines outlive the agent: a restarted agent adopts what is still running, tells replica
workflows about engines that died while it was away, and stops engines no workflow owns (the
policy: activities/agent/engine_ownership.py).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.agent.artifact_activity import ArtifactActivities
from activities.agent.engine_memory import EngineMemoryReader
from activities.agent.engine_ownership import (
    NodeEnd,
    node_end,
    reconcile_shards,
    stop_engines_and_tell,
)
from activities.agent.kv.service import KvService
from activities.agent.liveness import NodePulse
from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from activities.agent.node_metrics import EngineLoadSample, NodeMetricsService
from workers.connect import connect_with_retry
from workers.paths import Locations
from workers.signals import stop_event, wait_or_stop
from workflows import options, otel
from workflows.addresses import http_base
from workflows.contracts import (
    EngineLoadRequest,
    NodeInventory,
    NodeRegistration,
    NodeView,
)
from workflows.names import (
    CONTROL_TASK_QUEUE,
    node_task_queue,
    node_workflow_id,
    reserved_node_name,
)
from workflows.node.proof import signed_registration
from workflows.node.workflow import NodeWorkflow

log = logging.getLogger("llmgw.agent")
# On stopping, how long the agent waits for its liveness watch to tell the node workflow (the
# next watch then waits for the agent's successor rather than timing out).
HAND_OVER_S = 2.0


@dataclass
class AgentOptions:
    node: str
    address: str = "127.0.0.1"
    engine_paths: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    # How often the agent looks at its machine again (a fabric manager restarting drops every
    # card out of its NVLink domain at once) and at the engines it runs.
    look_every_s: float = 60.0
    heartbeat_s: float = options.NODE_HEARTBEAT.total_seconds()
    lost_after_s: float = options.NODE_GRACE.total_seconds()
    gone_after_s: float = options.NODE_GONE_GRACE.total_seconds()
    # `llmgw up` owns the whole machine and leaves nothing behind; a standalone agent leaves its
    # engines serving across its own restarts.
    stop_engines_on_exit: bool = False
    install_os_packages: bool = False
    # The KV feed's port on `address` (activities/agent/kv/service.py); 0: no feed.
    kv_feed_port: int = 0
    # The control plane's mirror for model artifacts; "": fetch requests must name one.
    mirror: str = ""
    # Prometheus /metrics (GPU telemetry, engine load) on metrics_host:metrics_port; port 0:
    # not served (activities/agent/node_metrics.py).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0


class NodeRemoved(Exception):
    """The node's workflow completed with the node removed (`llmgw node rm`)."""


async def register(
    client: Client, reg: NodeRegistration, task_queue: str = CONTROL_TASK_QUEUE
) -> NodeView:
    """Start the node's workflow on the control workers' `task_queue` if it is new, then hand
    it this registration."""
    start = WithStartWorkflowOperation(
        NodeWorkflow.run,
        id=node_workflow_id(reg.inventory.name),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return await client.execute_update_with_start_workflow(
        NodeWorkflow.register, reg, start_workflow_operation=start
    )


async def run_agent(where: Locations, opts: AgentOptions) -> None:
    reserved = reserved_node_name(opts.node)
    if reserved is not None:
        raise SystemExit(f"{reserved} (--node)")
    secret_file = where.node_secret_file(opts.node)
    if not secret_file.exists():
        raise SystemExit(
            f"no node secret at {secret_file}: run `llmgw node add {opts.node}` where the "
            "cluster's store is, then start this agent with `--join TOKEN` (`llmgw up` "
            "writes it for its own machine's agent)"
        )
    config = AgentConfig(
        node=opts.node,
        address=opts.address,
        state_dir=where.state_dir,
        cache_dir=where.cache_dir,
        node_secret=bytes.fromhex(secret_file.read_text().strip()),
        engine_paths=opts.engine_paths,
        kv_feed_port=opts.kv_feed_port,
        mirror=opts.mirror,
        install_os_packages=opts.install_os_packages,
    )
    # Before the client connects: its interceptor traces activities when this is on.
    otel.start("llmgw-agent")
    kv = KvService(config)
    agent = NodeAgentActivities(config, on_launch=kv.poke, own_ports=kv.listening_ports)
    # Before Temporal is reached: gateways keep reading what engines cache while it is away,
    # and Prometheus keeps seeing the GPUs.
    await kv.start(agent.supervisor)
    metrics = await start_metrics(opts, config, agent)
    try:
        await serve_agent(where, opts, config, agent)
    finally:
        if metrics is not None:
            await metrics.stop()
        await kv.stop()


# The SDK sends an activity's heartbeats to Temporal at most once per 80% of its heartbeat
# timeout, up to this: 48 s for a fetch, a minute for an install, by default. A fetch's bytes
# and an install's build progress reach the Temporal UI and `llmgw fetches` / `llmgw nodes`
# only when sent, so sooner. Heartbeats are not history events: this costs RPCs, not history.
HEARTBEAT_THROTTLE = timedelta(seconds=10)


def engine_reader(agent: NodeAgentActivities) -> Callable[[], Awaitable[list[EngineLoadSample]]]:
    """Each running engine's load, read from its own metrics as the autoscaler's activity
    reads it."""

    memory_reader = EngineMemoryReader()

    async def read() -> list[EngineLoadSample]:
        shards = await asyncio.to_thread(agent.supervisor.shards)
        running = [s for s in shards if not s.launching]
        request = EngineLoadRequest(replica_ids=[s.replica_id for s in running])
        report = await agent.engine_load(request)
        memory = await asyncio.to_thread(memory_reader.measure_all, running)
        return [
            EngineLoadSample(spec.replica_id, spec.engine, load, used)
            for spec, load, used in zip(running, report.engines, memory, strict=True)
        ]

    return read


async def start_metrics(
    opts: AgentOptions, config: AgentConfig, agent: NodeAgentActivities
) -> NodeMetricsService | None:
    """Serve the node's metrics when asked to, and put their URL in the inventory."""
    if not opts.metrics_port:
        return None
    service = NodeMetricsService(
        opts.node, engine_reader(agent), read_inventory=lambda: agent.last_inventory
    )
    try:
        port = await service.start(opts.metrics_host, opts.metrics_port)
    except OSError as err:
        raise SystemExit(
            f"cannot serve metrics on {opts.metrics_host}:{opts.metrics_port}: {err}"
        ) from None
    config.metrics_url = metrics_url(opts.metrics_host, port, opts.address)
    log.info("metrics on %s", config.metrics_url)
    return service


def metrics_url(host: str, port: int, node_address: str) -> str:
    """Where others reach the metrics: a wildcard listener (0.0.0.0, ::) is reached at the
    node's own address, the one engines listen on."""
    if host in ("", "0.0.0.0", "::"):
        host = node_address
    return f"{http_base(host, port)}/metrics"


async def serve_agent(
    where: Locations, opts: AgentOptions, config: AgentConfig, agent: NodeAgentActivities
) -> None:
    client = await connect_with_retry(where)
    stop = stop_event()
    pulse = NodePulse(opts.node, opts.heartbeat_s, verify=agent.reverify_all)
    # Fetches of model artifacts from the mirror sit beside the engine activities.
    activities = [*agent.all(), *ArtifactActivities(config).all(), pulse.watch]
    worker = Worker(
        client,
        task_queue=node_task_queue(opts.node),
        activities=activities,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )
    removed = False
    try:
        async with worker:
            await serve_node(client, agent, opts, config.node_secret, stop, pulse)
    except NodeRemoved:
        removed = True
        log.warning("node %s was removed from the cluster; stopping its engines", opts.node)
    finally:
        if opts.stop_engines_on_exit or removed:
            await stop_engines_and_tell(client, agent)


async def serve_node(
    client: Client,
    agent: NodeAgentActivities,
    opts: AgentOptions,
    node_secret: bytes,
    stop: asyncio.Event,
    pulse: NodePulse,
) -> None:
    """Register, then look at the machine and its engines again every `look_every_s` until
    stopped. The node's liveness is `pulse`'s watch, which the worker runs."""
    inventory = await asyncio.to_thread(agent.inventory_now)
    pulse.look(inventory, await running_engines(agent))
    reg = NodeRegistration(
        inventory=inventory,
        boot_id=pulse.boot_id,
        labels=opts.labels,
        engine_paths=opts.engine_paths,
        lost_after_s=opts.lost_after_s,
        gone_after_s=max(opts.gone_after_s, opts.lost_after_s),
    )
    # Engines whose workflows closed while this agent was away are stopped before the node is
    # offered to placement again: their GPUs and ports may be handed out the moment it is.
    await reconcile_shards(client, agent)
    try:
        # Signed now, each time: the node workflow takes a signature once (workflows/node/proof.py).
        await register(client, signed_registration(reg, node_secret, int(time.time() * 1000)))
    except WorkflowUpdateFailedError as err:
        # Another machine holds this name, or this is not the node's token: say so and stop,
        # rather than retrying forever under systemd.
        raise SystemExit(f"node {opts.node}: registration refused: {err.cause}") from None
    log.info(
        "node %s registered: %d cores, %d MB, %d GPUs",
        opts.node,
        inventory.cpu_cores,
        inventory.memory_mb,
        len(inventory.gpus),
    )
    workflow_id = node_workflow_id(opts.node)
    loop = asyncio.get_running_loop()
    next_look = loop.time() + opts.look_every_s
    try:
        while not stop.is_set():
            await wait_or_stop(stop, opts.heartbeat_s)
            if stop.is_set():
                break
            if loop.time() >= next_look:
                next_look = loop.time() + opts.look_every_s
                changed = await look_again(agent, inventory)
                if changed is not None:
                    inventory = changed
                pulse.look(inventory, await running_engines(agent))
                await reconcile_shards(client, agent)
            # No watch for a grace: the workflow may have ended (an operator removed the
            # node, or terminated its workflow), or only be slow to ask (its control worker is
            # away). Ask which.
            if pulse.unwatched_for() > opts.lost_after_s:
                end = await node_end(client, workflow_id)
                if end == NodeEnd.REMOVED:
                    raise NodeRemoved
                if end == NodeEnd.CLOSED:
                    again = reg.model_copy(update={"inventory": inventory})
                    signed = signed_registration(again, node_secret, int(time.time() * 1000))
                    await come_back(client, opts.node, signed)
    finally:
        pulse.stop()
        await pulse.handed_over(HAND_OVER_S)


async def running_engines(agent: NodeAgentActivities) -> int:
    """How many engines run here, for the watch's heartbeat line."""
    shards = await asyncio.to_thread(agent.supervisor.shards)
    return sum(1 for spec in shards if agent.supervisor.is_alive(spec.replica_id))


async def look_again(agent: NodeAgentActivities, before: NodeInventory) -> NodeInventory | None:
    """The machine as it is now (with the artifacts it holds), when it differs from what the
    node workflow was last told."""
    try:
        now = await asyncio.to_thread(agent.inventory_now)
    except Exception as err:  # noqa: BLE001 - unforeseen output must not end the loop
        log.warning("discovery failed: %s", err)
        return None
    return now if now.comparable() != before.comparable() else None


async def come_back(client: Client, node: str, reg: NodeRegistration) -> None:
    """The node's workflow closed without the node being removed (an operator terminated,
    cancelled or reset it): register again, which starts a new one. Its engines keep serving
    all along; the new workflow leaves them and their allocations alone."""
    log.warning("node %s: its workflow ended without `llmgw node rm`; registering again", node)
    try:
        await register(client, reg)
    except WorkflowUpdateFailedError as err:
        log.warning("node %s: registration refused: %s", node, err.cause)
    except RPCError as err:
        log.warning("node %s: could not register again (tried at the next look): %s", node, err)


def main(where: Locations, opts: AgentOptions) -> None:
    asyncio.run(run_agent(where, opts))
