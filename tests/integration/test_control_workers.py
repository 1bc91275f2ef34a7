"""Control workers side by side (issue 16): a second `llmgw control` beside `up`'s own shares the
control queue; with `up`'s one frozen, the second alone starts a scale-up and is killed with -9
part-way through. The scale-up still completes once `up`'s worker thaws, no request fails, the
first replica keeps its engine, and the ledger books every port and core once. Then the other
way round: `up`'s own worker killed mid scale-up while the second one serves."""

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.test_outages import MODEL, SteadyLoad
from tests.system import REPO, System, wait_for, wait_ready
from workflows.contracts import LedgerState

pytestmark = pytest.mark.integration


def start_control_worker(system: System, log_file: Path) -> subprocess.Popen[bytes]:
    """`llmgw control` as an operator starts another one: same state dir, same Temporal."""
    with log_file.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "control"],
            cwd=REPO, env=system.env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def booked_twice(state: LedgerState) -> list[str]:
    """Ports booked by two allocations on one node, and nodes with more cores booked than
    they have."""
    problems = []
    ports: Counter[tuple[str, int]] = Counter()
    cores: Counter[str] = Counter()
    for allocation in state.allocations.values():
        for shard in allocation.shards_or_leader():
            ports[(shard.node, shard.port)] += 1
            cores[shard.node] += shard.cpu_cores
    problems += [f"port {node}:{port} x{n}" for (node, port), n in ports.items() if n > 1]
    for node, booked in cores.items():
        have = state.nodes[node].inventory.cpu_cores if node in state.nodes else 0
        if have and booked > have:
            problems.append(f"{node}: {booked} cores booked of {have}")
    return problems


def model_entries(state: LedgerState) -> tuple[list[str], list[str]]:
    allocated = sorted(a for a in state.allocations if a.startswith(f"{MODEL}-"))
    routed = sorted(r for r in state.routes if r.startswith(f"{MODEL}-"))
    return allocated, routed


async def test_killing_one_of_two_control_workers_mid_scale_loses_nothing(
    system: System, weights: Path, tmp_path: Path
) -> None:
    system.cli("model", "add", MODEL, "--weights", str(weights), "--cpu-cores", "1")
    first = (await wait_ready(system, MODEL, 1))[0]
    engine = system.engine_pid(first)
    assert engine is not None

    log_file = tmp_path / "control-2.log"
    extra = start_control_worker(system, log_file)
    own = system.child_pid("control")
    frozen = False
    try:
        wait_for(
            lambda: "control worker on" in log_file.read_text(errors="replace"),
            60,
            "the second control worker to poll",
        )
        with SteadyLoad(system) as load:
            # Only the second worker takes control tasks now.
            os.kill(own, signal.SIGSTOP)
            frozen = True
            system.cli("model", "scale", MODEL, "2")

            async def placed() -> bool:
                allocated, _ = model_entries(await system.ledger())
                return len(allocated) == 2

            await system.until(placed, 60, "the second worker to place the new replica")
            at_kill = (await system.ledger()).routes.get(f"{MODEL}-1")
            extra.kill()  # -9, part-way through the scale-up
            print(f"new replica as the worker was killed: {at_kill and at_kill.state}")
            extra.wait(10)
            os.kill(own, signal.SIGCONT)
            frozen = False

            ready = await wait_ready(system, MODEL, 2, timeout=120)
            assert first in ready
            system.cli("model", "scale", MODEL, "1")

            async def scaled_down() -> bool:
                return model_entries(await system.ledger()) == ([first], [first])

            await system.until(scaled_down, 60, "the second replica stopped and released")
    finally:
        if frozen:
            os.kill(own, signal.SIGCONT)
        if extra.poll() is None:
            extra.kill()
            extra.wait(10)

    print(f"outcomes: {dict(load.outcomes)}")
    assert load.outcomes["200"] > 0
    assert load.failed == 0, f"requests failed: {dict(load.outcomes)}"
    assert system.engine_pid(first) == engine, "the first replica's engine was restarted"

    state = await system.ledger()
    assert booked_twice(state) == []
    allocated, routed = model_entries(state)
    assert allocated == routed == [first], (allocated, routed)
    system.cli("model", "rm", MODEL)
    await system.until(lambda: system.released(MODEL), 60, "the model's allocations released")


async def test_killing_ups_own_control_worker_mid_scale_loses_nothing(
    system: System, weights: Path, tmp_path: Path
) -> None:
    """The other way round: the second worker stays, `up`'s own is killed (and restarted by
    `up`) part-way through a scale-up."""
    add = ("model", "add", MODEL, "--weights", str(weights), "--cpu-cores", "1")
    # The test before removed the same model; its removal may still be finishing.
    wait_for(lambda: system.cli(*add, check=False).returncode == 0, 60, f"{MODEL} added again")
    first = (await wait_ready(system, MODEL, 1))[0]
    engine = system.engine_pid(first)
    assert engine is not None

    log_file = tmp_path / "control-2.log"
    extra = start_control_worker(system, log_file)
    try:
        wait_for(
            lambda: "control worker on" in log_file.read_text(errors="replace"),
            60,
            "the second control worker to poll",
        )
        restarts_before = sum("control exited" in line for line in system.output)
        with SteadyLoad(system) as load:
            system.cli("model", "scale", MODEL, "2")

            async def placed() -> bool:
                allocated, _ = model_entries(await system.ledger())
                return len(allocated) == 2

            await system.until(placed, 60, "the new replica placed")
            at_kill = (await system.ledger()).routes.get(f"{MODEL}-1")
            os.kill(system.child_pid("control"), signal.SIGKILL)
            print(f"new replica as up's worker was killed: {at_kill and at_kill.state}")
            wait_for(
                lambda: sum("control exited" in line for line in system.output) > restarts_before,
                30,
                "up to restart its control worker",
            )
            ready = await wait_ready(system, MODEL, 2, timeout=120)
            assert first in ready
            system.cli("model", "scale", MODEL, "1")

            async def scaled_down() -> bool:
                return model_entries(await system.ledger()) == ([first], [first])

            await system.until(scaled_down, 60, "the second replica stopped and released")
    finally:
        if extra.poll() is None:
            extra.kill()
            extra.wait(10)

    print(f"outcomes: {dict(load.outcomes)}")
    assert load.outcomes["200"] > 0
    assert load.failed == 0, f"requests failed: {dict(load.outcomes)}"
    assert system.engine_pid(first) == engine, "the first replica's engine was restarted"
    assert booked_twice(await system.ledger()) == []
    system.cli("model", "rm", MODEL)
    await system.until(lambda: system.released(MODEL), 60, "the model's allocations released")
