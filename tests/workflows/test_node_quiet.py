"""A node whose machine does not change costs its workflow no history: its agent re-verifies
the engines while it holds the liveness watch (activities/agent/liveness.py, the real one
here), and only a result that differs, or a machine that changed, reaches the node's record."""

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.worker import Worker

from activities.agent.liveness import NodePulse
from tests.workflows.conftest import Cluster, eventually, record_history, unique
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_node import register, registration
from tests.workflows.test_node_liveness import history_length, node_handle_of
from workflows import options
from workflows.contracts import EngineState, EngineStatus, NodeRecord, NodeState
from workflows.names import NodeActivity, node_task_queue, node_workflow_id
from workflows.node.workflow import NodeWorkflow

# Re-verification every VERIFY_S of real time (the agent's clock), the watch returning only
# after its usual hour: every "refresh period" of the test is a re-verification.
VERIFY_S = 0.5
PERIODS = 20


class Machine:
    """What re-verification on the node finds: the fake agent's broken engines fail."""

    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent
        self.checks = 0

    def verify(self, engines: list[EngineStatus]) -> list[EngineStatus]:
        self.checks += 1
        now = []
        for status in engines:
            if status.engine in self.agent.broken:
                detail = self.agent.broken[status.engine]
                status = status.model_copy(update={"state": EngineState.FAILED, "detail": detail})
            else:
                status = status.model_copy(
                    update={"state": EngineState.INSTALLED, "detail": "version: 1 (fake)"}
                )
            now.append(status.model_copy(update={"verified_at": f"check {self.checks}"}))
        return now


@contextlib.asynccontextmanager
async def real_watch_agent(
    cluster: Cluster,
) -> AsyncIterator[tuple[str, FakeAgent, NodePulse, Machine]]:
    """A node of the test's own whose agent holds the real watch, re-verifying with Machine."""
    node = unique("quiet")
    agent = FakeAgent(node)
    machine = Machine(agent)
    pulse = NodePulse(node, 0.2, verify=machine.verify)
    pulse.look(agent.inventory, 0)
    activities = [a for a in agent.all() if a != agent.watch] + [pulse.watch]
    async with Worker(cluster.client, task_queue=node_task_queue(node), activities=activities):
        try:
            yield node, agent, pulse, machine
        finally:
            pulse.stop()
            await pulse.handed_over(2.0)
            record = (await cluster.ledger()).nodes.get(node)
            if record is not None:  # out of placement for the tests after this one
                record.state = NodeState.LOST
                await cluster.fleet.upsert_node(record)


async def held_watch(cluster: Cluster, node: str) -> tuple[str, str]:
    """The node workflow's current run, and the latest heartbeat Temporal holds for its watch
    ("": none yet)."""
    described = await cluster.client.get_workflow_handle(node_workflow_id(node)).describe()
    for pending in described.raw_description.pending_activities:
        details = pending.heartbeat_details.payloads
        if pending.activity_type.name == NodeActivity.WATCH_LIVENESS and details:
            [beat] = await cluster.client.data_converter.decode(details)
            return described.run_id or "", str(beat)
    return described.run_id or "", ""


async def record_of(cluster: Cluster, node: str) -> NodeRecord | None:
    return (await cluster.ledger()).nodes.get(node)


async def test_an_unchanged_node_adds_no_history_and_a_change_reaches_its_record(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(options, "ENGINE_REVERIFY_ON_NODE", timedelta(seconds=VERIFY_S))
    async with real_watch_agent(cluster) as (node, agent, pulse, machine):
        await register(cluster, node, registration(node, boot_id=pulse.boot_id))

        async def installed_and_checked() -> bool:
            record = await record_of(cluster, node)
            engine = record.engines.get("llamacpp") if record else None
            held = bool((await held_watch(cluster, node))[1])
            return held and engine is not None and engine.state == EngineState.INSTALLED

        installed_and_checked.__doc__ = f"{node} installed, its agent holding the watch"
        await eventually(installed_and_checked, timeout=30)

        async def verified_once() -> bool:
            return machine.checks >= 2

        await eventually(verified_once, timeout=30)
        # The first re-verification may differ from the install's line (it did not here: the
        # fake install says the same); from now on nothing on the machine changes.
        run, _ = await held_watch(cluster, node)
        before, checks = await history_length(cluster.client, node), machine.checks
        published = (await record_of(cluster, node)).engines["llamacpp"]  # type: ignore[union-attr]

        async def many_periods() -> bool:
            return machine.checks >= checks + PERIODS

        many_periods.__doc__ = f"{PERIODS} more re-verifications on the node"
        await eventually(many_periods, timeout=60)
        # 20 re-verification periods: not one history event, the same watch of the same run,
        # and the record as it was.
        assert (await held_watch(cluster, node))[0] == run
        assert await history_length(cluster.client, node) == before
        assert (await record_of(cluster, node)).engines["llamacpp"] == published  # type: ignore[union-attr]

        # An upgrade elsewhere takes a library away: the next re-verification reaches the
        # record (and with it placement), without any schedule.
        agent.broken["llamacpp"] = "re-verification failed: libcudart.so.12 missing (fake)"

        async def failed() -> bool:
            record = await record_of(cluster, node)
            engine = record.engines.get("llamacpp") if record else None
            return engine is not None and engine.state == EngineState.FAILED

        failed.__doc__ = "the failed re-verification in the node's record"
        await eventually(failed, timeout=30)
        assert "libcudart" in (await record_of(cluster, node)).engines["llamacpp"].detail  # type: ignore[union-attr]

        # Put back: installed again.
        del agent.broken["llamacpp"]

        async def back() -> bool:
            record = await record_of(cluster, node)
            return record is not None and record.engines["llamacpp"].state == EngineState.INSTALLED

        back.__doc__ = "the engine installed again in the node's record"
        await eventually(back, timeout=30)

        # The agent's look finds more memory: the watch reports it, and the record has it.
        pulse.look(agent.inventory.model_copy(update={"memory_mb": 32768}), 0)

        async def bigger() -> bool:
            record = await record_of(cluster, node)
            return record is not None and record.inventory.memory_mb == 32768

        bigger.__doc__ = "the node's new memory in its record"
        await eventually(bigger, timeout=30)
        view = await node_handle_of(cluster, node).query(NodeWorkflow.describe)
        assert view is not None
        assert view.record.inventory.memory_mb == 32768
        await record_history(
            cluster.client.get_workflow_handle(node_workflow_id(node)), "NodeQuiet"
        )
