"""`python -m bench.node_liveness` (`make bench-liveness`): the workflow history one node costs
per day in steady state (its machine and engines unchanged), schedules included, now and with
the previous design's settings.

A command, not a test: it starts an embedded Temporal dev server (SQLite file, headless) in a
temporary directory and a control worker in this process, then runs two nodes in turn, each with
an agent holding the real liveness watch (activities/agent/liveness.py) on its own task queue:

- `previous`: the settings before history was bounded per node: the watch returns every 15 min,
  the agent re-verifies nothing itself, and the two refresh schedules run (a FleetRefresh
  signalling `refresh` to the node every 5 min for its inventory and every 10 min for its
  engines, which the node workflow answers with a discovery, a re-verification and a record
  write), as the schedules did by default;
- `now`: the defaults: the watch returns every hour, the agent re-verifies the engines every
  10 min while it holds it, reporting only a result that differs, and the refresh schedules are
  paused (workers/schedules.py).

Both run today's workflow code; only the settings differ. Every interval is divided by
--speedup (720: a simulated day in two real minutes); the node's grace is not (nothing here
should be found silent). After the node has registered and installed its engine, it counts the
events (and their serialized bytes) its workflow history gains over --hours simulated hours
(24: a whole day; fewer: scaled to a day, and said so), over all its runs. The engine install,
discovery and verification are stand-ins that answer at once with the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from activities.agent.liveness import NodePulse
from bench.dev_server import scratch_dev_server
from store.fleet import open_fleet
from workers.agent import register
from workers.control import control_activities
from workers.registry import CONTROL_WORKFLOWS
from workers.schedules import ScheduleSettings
from workers.search_attributes import ensure_search_attributes
from workflows import options
from workflows.client import connect
from workflows.contracts import (
    DiscoverRequest,
    EngineInstallRequest,
    EngineState,
    EngineStatus,
    NodeInventory,
    NodeRefresh,
    NodeRegistration,
    VerifyEnginesRequest,
    VerifyEnginesResult,
)
from workflows.fleet import FleetRefreshWorkflow
from workflows.names import CONTROL_TASK_QUEUE, NodeActivity, node_task_queue, node_workflow_id
from workflows.node.workflow import NodeWorkflow

DAY_S = 86400.0
HEARTBEAT_S = options.NODE_HEARTBEAT.total_seconds()
SCHEDULES = ScheduleSettings()


@activity.defn(name=NodeActivity.INSTALL_ENGINE)
async def install_at_once(req: EngineInstallRequest) -> EngineStatus:
    """A stand-in install: what is measured is steady state, not builds."""
    return EngineStatus(
        engine=req.requirement.engine,
        version=req.requirement.version,
        state=EngineState.INSTALLED,
        path=f"/bench/{req.requirement.engine}",
        detail="version: 1 (bench)",
    )


def verified(engines: list[EngineStatus]) -> list[EngineStatus]:
    """What a re-verification of an unchanged engine says: the same, checked now."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    return [s.model_copy(update={"verified_at": now}) for s in engines]


class Machine:
    """A node's agent activities besides the watch: the same machine on every look."""

    def __init__(self, node: str) -> None:
        self.inventory = NodeInventory(name=node, cpu_cores=8, memory_mb=16384)

    @activity.defn(name=NodeActivity.DISCOVER)
    async def discover(self, req: DiscoverRequest) -> NodeInventory:  # noqa: ARG002
        return self.inventory

    @activity.defn(name=NodeActivity.VERIFY_ENGINES)
    async def verify_engines(self, req: VerifyEnginesRequest) -> VerifyEnginesResult:
        return VerifyEnginesResult(engines=verified(req.engines))


@dataclass
class Design:
    name: str
    watch_period: timedelta
    # 0: the agent re-verifies nothing itself.
    verify_on_node: timedelta
    # The refresh schedules run (inventory, engines), or are paused.
    schedules: bool

    def describe(self) -> str:
        watch = f"watch {self.watch_period.total_seconds() / 60:g} min"
        if self.schedules:
            every = (SCHEDULES.inventory_every, SCHEDULES.reverify_every)
            inv, eng = (e.total_seconds() / 60 for e in every)
            return f"{watch}, refresh schedules (inventory {inv:g} min, engines {eng:g} min)"
        verify = self.verify_on_node.total_seconds() / 60
        return f"{watch}, engines re-verified on the node every {verify:g} min, no schedules"


PREVIOUS = Design("previous", timedelta(minutes=15), timedelta(0), schedules=True)
NOW = Design("now", options.NODE_WATCH_PERIOD, options.ENGINE_REVERIFY_ON_NODE, schedules=False)


@dataclass
class NodeFigures:
    design: Design
    events: int
    bytes: int
    runs: int
    hours: float

    @property
    def events_per_day(self) -> float:
        return self.events * 24 / self.hours

    @property
    def bytes_per_day(self) -> float:
        return self.bytes * 24 / self.hours


async def history(client: Client, node: str) -> tuple[int, int, int]:
    """Events and their serialized bytes in the node workflow's history over all its runs, and
    how many runs."""
    events = size = runs = 0
    run_id: str | None = None
    while True:
        fetched = await client.get_workflow_handle(
            node_workflow_id(node), run_id=run_id
        ).fetch_history()
        events, runs = events + len(fetched.events), runs + 1
        size += sum(e.ByteSize() for e in fetched.events)
        started = fetched.events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id
        if not run_id:
            return events, size, runs


async def schedule(client: Client, node: str, req: NodeRefresh, every_s: float) -> None:
    """What a refresh schedule does: start a FleetRefresh every interval (here for one node)."""
    n = 0
    while True:
        await asyncio.sleep(every_s)
        n += 1
        kind = "inventory" if req.inventory else "engines"
        refresh = req.model_copy(update={"nodes": [node]})
        await client.start_workflow(
            FleetRefreshWorkflow.run,
            refresh,
            id=f"bench-{kind}-{node}-{n}",
            task_queue=CONTROL_TASK_QUEUE,
        )


async def installed(client: Client, node: str) -> None:
    handle = client.get_workflow_handle_for(NodeWorkflow.run, node_workflow_id(node))
    for _ in range(600):
        view = await handle.query(NodeWorkflow.describe)
        engines = view.record.engines.values() if view is not None else []
        if engines and all(e.state == EngineState.INSTALLED for e in engines):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{node} never installed its engine")


async def one_node(
    client: Client, agents: Client, design: Design, speedup: float, hours: float
) -> NodeFigures:
    # Read by the node workflow (this process's control worker) when it asks for a watch.
    options.NODE_WATCH_PERIOD = design.watch_period / speedup
    options.ENGINE_REVERIFY_ON_NODE = design.verify_on_node / speedup
    node = design.name
    every_s = max(HEARTBEAT_S / speedup, 0.2)
    pulse = NodePulse(node, every_s, verify=verified)
    machine = Machine(node)
    agent = Worker(
        agents,
        task_queue=node_task_queue(node),
        activities=[pulse.watch, install_at_once, machine.discover, machine.verify_engines],
        max_heartbeat_throttle_interval=timedelta(seconds=every_s),
    )
    async with agent:
        pulse.look(machine.inventory, 0)
        await register(client, NodeRegistration(inventory=machine.inventory, boot_id=pulse.boot_id))
        await installed(client, node)
        runs = []
        if design.schedules:
            for req, every in (
                (NodeRefresh(inventory=True), SCHEDULES.inventory_every),
                (NodeRefresh(engines=True), SCHEDULES.reverify_every),
            ):
                every_s = every.total_seconds() / speedup
                runs.append(asyncio.create_task(schedule(client, node, req, every_s)))
        try:
            # Into its stride: the first watch and verification with the engine installed.
            await asyncio.sleep(2 * options.NODE_WATCH_PERIOD.total_seconds())
            before = await history(client, node)
            await asyncio.sleep(hours * 3600 / speedup)
            after = await history(client, node)
        finally:
            for task in runs:
                task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
        await client.get_workflow_handle(node_workflow_id(node)).terminate("bench over")
    return NodeFigures(
        design=design,
        events=after[0] - before[0],
        bytes=after[1] - before[1],
        runs=after[2],
        hours=hours,
    )


async def bench(address: str, config: Path, speedup: float, hours: float) -> list[NodeFigures]:
    client = await connect(address)
    fleet = open_fleet(None, config.parent)
    await fleet.init()
    agents = await connect(address)  # the agents' own connection
    await ensure_search_attributes(client)
    control = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(client, fleet, config),
    )
    async with control:
        return [await one_node(client, agents, d, speedup, hours) for d in (PREVIOUS, NOW)]


def report(figures: list[NodeFigures], speedup: float, hours: float) -> None:
    real = hours * 3600 / speedup
    measured = "one simulated day" if hours == 24 else f"{hours:g} simulated hours, scaled to a day"
    print(f"one node in steady state, {measured} ({real:.0f} s real at --speedup {speedup:g})")
    print(f"{'design':10} {'events/day':>10} {'KB/day':>8} {'runs':>5}  settings")
    for row in figures:
        print(
            f"{row.design.name:10} {row.events_per_day:>10.0f} {row.bytes_per_day / 1024:>8.1f} "
            f"{row.runs:>5}  {row.design.describe()}"
        )
    previous, now = figures
    ratio = previous.events_per_day / max(now.events_per_day, 1)
    print(f"now: {ratio:.0f}x fewer history events per node per day (goal: at most 300)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_liveness", description=__doc__)
    parser.add_argument(
        "--speedup", type=float, default=720.0, help="divide every interval by this (default 720)"
    )
    parser.add_argument(
        "--hours", type=float, default=24.0, help="simulated hours measured (default 24)"
    )
    args = parser.parse_args(argv)
    # The agents' cancelled watches at the end are expected; the figures are not.
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    started = time.monotonic()
    with scratch_dev_server() as (server, workdir):
        config = workdir / "llmgw.yaml"
        config.write_text("")
        figures = asyncio.run(bench(server.address, config, args.speedup, args.hours))
        report(figures, args.speedup, args.hours)
        print(f"\ntook {time.monotonic() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
