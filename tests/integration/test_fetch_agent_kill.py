"""The node agent killed (SIGKILL) while it fetches a model's weights from the mirror, on a
real `llmgw up`: `llmgw fetches` shows the fetch and how far it got, `up` starts a new agent,
Temporal retries the fetch once its heartbeat times out (workflows/options.py FETCH_HEARTBEAT, a
minute), and the new agent resumes from the bytes the dead one had written rather than starting
over; the digest still checks, and the replica serves. With the stand-in engine (it only opens
the weights file)."""

import asyncio
import hashlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system import STANDIN_ENGINE, System, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.long]

MODEL = "fetched-under-fire"
SIZE = 1 << 30  # large enough that the fetch takes a while even on loopback
KILL_PAST = 64 << 20  # bytes the dead agent has written when it is killed


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    system = System(tmp_path_factory.mktemp("state"), demo=False, engine_path=STANDIN_ENGINE)
    system.start(timeout=120)
    yield system
    if system.process is not None and system.process.poll() is None:
        system.stop()


def big_weights(directory: Path) -> tuple[Path, str]:
    """A GGUF-headed file of SIZE bytes (sparse: nothing to write but the header)."""
    path = directory / "big.gguf"
    with path.open("wb") as out:
        out.write(b"GGUF")
        out.truncate(SIZE)
    return path, sha256_of(path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def partial_bytes(system: System) -> int:
    partials = list((system.state_dir / "artifacts" / ".partial").glob("*"))
    return max((p.stat().st_size for p in partials), default=0)


async def test_a_fetch_resumes_after_its_agent_is_killed(system: System, tmp_path: Path) -> None:
    weights, digest = big_weights(tmp_path)
    system.cli("model", "add", MODEL, "--from", str(weights), "--memory-mb", "1024")

    first_agent = system.child_pid("agent")
    deadline = asyncio.get_running_loop().time() + 60
    while partial_bytes(system) < KILL_PAST:
        assert asyncio.get_running_loop().time() < deadline, "the fetch never started"
        await asyncio.sleep(0.01)
    os.kill(first_agent, signal.SIGKILL)
    kept = partial_bytes(system)
    assert kept < SIZE, "killed too late: the fetch had finished"

    # The operator sees the fetch on its node, with what the dead agent last reported (its
    # heartbeat outlives it until the retry): the bytes, as its first heartbeat already has
    # the total; or, where the manifest took over a second to come, "reading the manifest"
    # (the next heartbeat reaches Temporal 10 s later, after the kill).
    shown = system.cli("fetches").stdout.splitlines()
    (row,) = [line for line in shown if MODEL in line]
    node, artifact, model, state = row.split()[:4]
    assert (node, model, state) == (system.node, MODEL, "fetching"), shown
    assert artifact.startswith("sha256:"), shown
    assert " of 1.07 GB (" in row or "reading the manifest" in row, shown

    await wait_ready(system, MODEL, 1, timeout=240)
    (fetched,) = (system.state_dir / "artifacts").glob("*/big.gguf")
    assert fetched.stat().st_size == SIZE
    assert system.child_pid("agent") != first_agent

    # The retry fetched only what the dead agent had not: the node activity's result is in the
    # history of the node's ArtifactFetch workflow. And the file is whole: the node checked its
    # sha256 before reporting it.
    client = await system.client()
    results = []
    runs = set()
    async for run in client.list_workflows("WorkflowType = 'ArtifactFetch'"):
        if (run.id, run.run_id) in runs:
            continue  # a run listed twice (visibility can lag a run's changes) is read once
        runs.add((run.id, run.run_id))
        history = await client.get_workflow_handle(run.id, run_id=run.run_id).fetch_history()
        for event in history.events:
            if event.HasField("activity_task_completed_event_attributes"):
                payload = event.activity_task_completed_event_attributes.result.payloads[0]
                answer = json.loads(payload.data)
                if isinstance(answer, dict) and "bytes_fetched" in answer:
                    results.append(answer)
    # The replica's start, failed by the kill and retried, may ask for the weights again: that
    # ask finds them whole and fetches nothing (reused, 0 bytes). What was fetched, was once.
    summary = [(r["bytes_fetched"], r["reused"]) for r in results]
    fetches = [r for r in results if not r["reused"]]
    assert len(fetches) == 1, summary
    assert all(r["bytes_fetched"] == 0 for r in results if r["reused"]), summary
    assert 0 < fetches[0]["bytes_fetched"] <= SIZE - kept, (summary, kept)
    assert sha256_of(fetched) == digest
