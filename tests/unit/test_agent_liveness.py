"""The agent's side of the liveness watch (activities/agent/liveness.py): it heartbeats while
nothing changes, and returns as soon as the workflow must hear something."""

import asyncio
import dataclasses
from datetime import timedelta

from temporalio.testing import ActivityEnvironment

from activities.agent.liveness import NodePulse
from workflows.contracts import NodeInventory, NodeWatch


def environment(beats: list[str]) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.4))
    env.on_heartbeat = lambda *details: beats.append(details[0])
    return env


def pulse_on(inventory: NodeInventory) -> NodePulse:
    pulse = NodePulse(inventory.name, heartbeat_s=10)
    pulse.look(inventory, engines_running=2)
    return pulse


async def test_a_probe_is_answered_at_once_with_nothing_new() -> None:
    machine = NodeInventory(name="gpu-01", cpu_cores=8, memory_mb=16384)
    pulse = pulse_on(machine)
    beats: list[str] = []
    report = await environment(beats).run(
        pulse.watch, NodeWatch(node="gpu-01", report_after_s=0, inventory_digest=machine.digest())
    )
    assert report.boot_id == pulse.boot_id
    assert (report.inventory, report.stopping) == (None, False)
    assert beats == [f"node gpu-01 (boot {pulse.boot_id[:8]}): 2 engine(s) running"]


async def test_a_changed_machine_is_reported_without_waiting_out_the_watch() -> None:
    machine = NodeInventory(name="gpu-01", cpu_cores=8, memory_mb=16384)
    pulse = pulse_on(machine)
    beats: list[str] = []
    request = NodeWatch(node="gpu-01", report_after_s=3600, inventory_digest=machine.digest())
    watching = asyncio.create_task(environment(beats).run(pulse.watch, request))
    while len(beats) < 3:  # it heartbeats (several times per heartbeat timeout) meanwhile
        await asyncio.sleep(0.01)
    assert not watching.done()
    bigger = machine.model_copy(update={"memory_mb": 32768})
    pulse.look(bigger, engines_running=2)
    report = await asyncio.wait_for(watching, 5)
    assert report.inventory == bigger


async def test_a_machine_the_workflow_does_not_know_yet_is_reported_at_once() -> None:
    machine = NodeInventory(name="gpu-01", cpu_cores=8, memory_mb=16384)
    older = machine.model_copy(update={"cpu_cores": 4})
    pulse = pulse_on(machine)
    request = NodeWatch(node="gpu-01", report_after_s=3600, inventory_digest=older.digest())
    report = await asyncio.wait_for(environment([]).run(pulse.watch, request), 5)
    assert report.inventory == machine


async def test_a_stopping_agent_says_so_and_hands_over() -> None:
    machine = NodeInventory(name="gpu-01", cpu_cores=8, memory_mb=16384)
    pulse = pulse_on(machine)
    beats: list[str] = []
    request = NodeWatch(node="gpu-01", report_after_s=3600, inventory_digest=machine.digest())
    watching = asyncio.create_task(environment(beats).run(pulse.watch, request))
    while not beats:
        await asyncio.sleep(0.01)
    assert pulse.unwatched_for() == 0
    pulse.stop()
    await pulse.handed_over(timeout_s=5)
    assert watching.done()
    report = watching.result()
    assert (report.stopping, report.inventory) == (True, None)
    # Said once: a watch its worker takes while stopping is held, not answered at once (the
    # workflow would ask again at once, over and over).
    request = NodeWatch(node="gpu-01", report_after_s=0.3, inventory_digest=machine.digest())
    again = await asyncio.wait_for(environment(beats).run(pulse.watch, request), 5)
    assert again.stopping is False


def test_what_only_counts_as_a_change_of_the_machine() -> None:
    machine = NodeInventory(name="gpu-01", cpu_cores=8, memory_mb=16384)
    assert machine.digest() == machine.model_copy().digest()
    assert machine.digest() != machine.model_copy(update={"memory_mb": 8192}).digest()
