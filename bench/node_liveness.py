"""`python -m bench.node_liveness` (`make bench-liveness`): the workflow history a node's
liveness costs, per node per hour, with heartbeat signals and with the liveness watch.

A command, not a test: it starts an embedded Temporal dev server (SQLite file, headless) in a
temporary directory, a control worker in this process, and two nodes, each with an agent on its
own task queue:

- `watch`: the agent's real liveness watch (activities/agent/liveness.py), which heartbeats
  the activity the node workflow keeps on the node's queue;
- `signals`: an agent from before the watch (its worker has no watch activity), which sends
  the node workflow a `heartbeat` signal every heartbeat interval, as every agent did before;
  the node workflow falls back to judging those, as it did then.

Both heartbeat every 10 s and the watch returns every 15 min, as by default, with every
interval divided by --speedup (60: a simulated hour in one real minute). After both nodes have
registered and installed their engine, it counts the events each node's workflow history gains
over one simulated hour (over all its runs, following continue-as-new), and the heartbeats each
agent sent. Only the liveness is real: the engine install is a stand-in that answers at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from activities.agent.liveness import NodePulse
from bench.dev_server import scratch_dev_server
from workers.agent import register
from workers.control import control_activities, ensure_ledger
from workers.registry import CONTROL_WORKFLOWS
from workers.search_attributes import ensure_search_attributes
from workflows import options
from workflows.client import connect
from workflows.contracts import (
    EngineInstallRequest,
    EngineState,
    EngineStatus,
    NodeHeartbeat,
    NodeInventory,
    NodeRegistration,
)
from workflows.names import CONTROL_TASK_QUEUE, NodeActivity, node_task_queue, node_workflow_id
from workflows.node import NodeWorkflow

HOUR_S = 3600.0
HEARTBEAT_S = options.NODE_HEARTBEAT.total_seconds()


@activity.defn(name=NodeActivity.INSTALL_ENGINE)
async def install_at_once(req: EngineInstallRequest) -> EngineStatus:
    """A stand-in install: what is measured is liveness, not builds."""
    return EngineStatus(
        engine=req.requirement.engine,
        version=req.requirement.version,
        state=EngineState.INSTALLED,
        path=f"/bench/{req.requirement.engine}",
    )


class CountingPulse(NodePulse):
    """The agent's real watch, counting the heartbeats it sends."""

    beats = 0

    def summary(self) -> str:
        self.beats += 1
        return super().summary()


@dataclass
class NodeFigures:
    how: str
    events_per_hour: int
    heartbeats_per_hour: int
    runs: int

    @property
    def per_heartbeat(self) -> float:
        return self.events_per_hour / max(self.heartbeats_per_hour, 1)


async def history_events(client: Client, node: str) -> tuple[int, int]:
    """Events in the node workflow's history over all its runs, and how many runs."""
    events = runs = 0
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(
            node_workflow_id(node), run_id=run_id
        ).fetch_history()
        events, runs = events + len(history.events), runs + 1
        started = history.events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id
        if not run_id:
            return events, runs


async def signal_beats(client: Client, node: str, every_s: float, sent: list[int]) -> None:
    """What agents did before the watch: a heartbeat signal every interval."""
    handle = client.get_workflow_handle(node_workflow_id(node))
    while True:
        await handle.signal(NodeWorkflow.heartbeat, NodeHeartbeat(boot_id="boot-1"))
        sent[0] += 1
        await asyncio.sleep(every_s)


async def installed(client: Client, node: str) -> None:
    handle = client.get_workflow_handle_for(NodeWorkflow.run, node_workflow_id(node))
    for _ in range(600):
        view = await handle.query(NodeWorkflow.describe)
        engines = view.record.engines.values() if view is not None else []
        if engines and all(e.state == EngineState.INSTALLED for e in engines):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{node} never installed its engine")


async def bench(address: str, config: Path, speedup: float) -> list[NodeFigures]:
    client = await connect(address)
    agents = await connect(address)  # the agents' own connection: one worker per queue each
    await ensure_search_attributes(client)
    every_s = HEARTBEAT_S / speedup
    pulse = CountingPulse("watch", every_s)
    control = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(client, config),
    )
    watch_agent = Worker(
        agents,
        task_queue=node_task_queue("watch"),
        activities=[pulse.watch, install_at_once],
        # The agent's own throttle (workers/agent.py) scaled like everything else.
        max_heartbeat_throttle_interval=timedelta(seconds=every_s),
    )
    signal_agent = Worker(
        agents, task_queue=node_task_queue("signals"), activities=[install_at_once]
    )
    sent = [0]
    async with control, watch_agent, signal_agent:
        await ensure_ledger(client)
        pulse.look(NodeInventory(name="watch", cpu_cores=8, memory_mb=16384), 0)
        for node, boot in (("watch", pulse.boot_id), ("signals", "boot-1")):
            inventory = NodeInventory(name=node, cpu_cores=8, memory_mb=16384)
            await register(client, NodeRegistration(inventory=inventory, boot_id=boot))
        beating = asyncio.create_task(signal_beats(client, "signals", every_s, sent))
        try:
            for node in ("watch", "signals"):
                await installed(client, node)
            await asyncio.sleep(2 * every_s)  # the signal agent is in its stride
            before = {node: await history_events(client, node) for node in ("watch", "signals")}
            beats = {"watch": pulse.beats, "signals": sent[0]}
            await asyncio.sleep(HOUR_S / speedup)
            after = {node: await history_events(client, node) for node in ("watch", "signals")}
            beats = {"watch": pulse.beats - beats["watch"], "signals": sent[0] - beats["signals"]}
        finally:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)
        for node in ("watch", "signals"):
            await client.get_workflow_handle(node_workflow_id(node)).terminate("bench over")
    how = {"watch": "liveness watch (activity heartbeats)", "signals": "heartbeat signals"}
    return [
        NodeFigures(
            how=how[node],
            events_per_hour=after[node][0] - before[node][0],
            heartbeats_per_hour=beats[node],
            runs=after[node][1],
        )
        for node in ("signals", "watch")
    ]


def report(figures: list[NodeFigures], speedup: float, period: timedelta) -> None:
    print(
        f"one node, one simulated hour ({HOUR_S / speedup:.0f} s real at --speedup {speedup:g}): "
        f"heartbeat every {HEARTBEAT_S:g} s, watch period {period.total_seconds() / 60:g} min"
    )
    print(f"{'liveness by':40} {'heartbeats':>10} {'history events':>15} {'per heartbeat':>14}")
    for row in figures:
        print(
            f"{row.how:40} {row.heartbeats_per_hour:>10} {row.events_per_hour:>15} "
            f"{row.per_heartbeat:>14.2f}"
        )
    signals, watch = figures
    ratio = signals.events_per_hour / max(watch.events_per_hour, 1)
    print(f"the watch writes {ratio:.0f}x fewer history events per node per hour")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_liveness", description=__doc__)
    parser.add_argument(
        "--speedup", type=float, default=60.0, help="divide every interval by this (default 60)"
    )
    args = parser.parse_args(argv)
    # The agents' failed and cancelled watches at the end are expected; the figures are not.
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    period = options.NODE_WATCH_PERIOD
    # Read by the node workflow when it asks for a watch: scaled like the heartbeats.
    options.NODE_WATCH_PERIOD = period / args.speedup
    started = time.monotonic()
    with scratch_dev_server() as (server, workdir):
        config = workdir / "llmgw.yaml"
        config.write_text("")
        figures = asyncio.run(bench(server.address, config, args.speedup))
        report(figures, args.speedup, period)
        print(f"\ntook {time.monotonic() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
