"""Faults through the real processes: a killed engine, a killed control worker, and a restart of
the whole system. Afterwards nothing is lost and nothing runs twice."""

import base64
import os
import signal
from pathlib import Path

import openai
import pytest

from store import open_store
from tests.system import System, wait_for, wait_ready
from workflows.engine_keys import engine_key_from_master
from workflows.names import replica_workflow_id

pytestmark = pytest.mark.integration


def chat(system: System, model: str) -> str:
    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "are you there"}]
    )
    return reply.choices[0].message.content or ""


async def test_killed_engine_is_restarted_and_serves_again(system: System, weights: Path) -> None:
    system.cli("model", "add", "phoenix", "--weights", str(weights), "--cpu-cores", "1")
    await wait_ready(system, "phoenix", 1)
    first = system.engine_pid("phoenix-0")
    assert first is not None
    os.kill(first, signal.SIGKILL)

    def restarted() -> bool:
        return system.engine_pid("phoenix-0") not in (None, first)

    wait_for(restarted, 30, "a new engine process")
    await wait_ready(system, "phoenix", 1)
    assert chat(system, "phoenix")
    status = system.cli("status").stdout
    assert "phoenix-0" in status
    assert "ready" in status
    system.cli("model", "rm", "phoenix")
    wait_for(lambda: not system.engine_processes(str(weights) + ".phoenix"), 30, "cleanup")


async def test_control_worker_killed_during_replica_start_loses_and_duplicates_nothing(
    system: System, weights: Path, tmp_path: Path
) -> None:
    # Weights of its own, so its engine processes can be counted on their command line.
    own = tmp_path / "twice.gguf"
    own.write_bytes(weights.read_bytes())
    system.cli(
        "model", "add", "twice", "--weights", str(own), "--cpu-cores", "1",
        "--arg=--load-delay", "--arg=2",
    )  # fmt: skip
    os.kill(system.child_pid("control"), signal.SIGKILL)  # `up` restarts it

    await wait_ready(system, "twice", 1, timeout=90)
    assert len(system.engine_processes(str(own))) == 1
    state = await system.ledger()
    mine = [a for a in state.allocations.values() if a.replica_id.startswith("twice-")]
    assert len(mine) == 1
    ports = [(a.node, a.port) for a in state.allocations.values()]
    assert len(ports) == len(set(ports)), "a port was reserved twice"
    assert chat(system, "twice")
    assert any("control exited" in line for line in system.output)
    system.cli("model", "rm", "twice")
    wait_for(lambda: not system.engine_processes(str(own)), 30, "its engine to stop")


async def test_no_secret_stands_in_workflow_history_or_the_temporal_database(
    system: System, weights: Path
) -> None:
    system.cli("model", "add", "echo", "--weights", str(weights), "--cpu-cores", "1")
    await wait_ready(system, "echo", 1)
    assert chat(system, "echo")
    store = open_store(None, system.state_dir)
    await store.init()
    master = await store.master_secret()
    await store.close()
    secrets = {
        "api key": system.api_key,
        # llmgw-<8 hex>-<43 urlsafe chars>: the secret may hold "-" itself, so cut by position.
        "api key secret part": system.api_key[len("llmgw-12345678-") :],
        "engine key": engine_key_from_master(master, system.node, "echo-0"),
        "master secret": master.hex(),
        "node secret": (system.state_dir / "agent" / system.node / "node.secret")
        .read_text()
        .strip(),
    }
    client = await system.client()
    history = await client.get_workflow_handle(replica_workflow_id("echo", 0)).fetch_history()
    payloads = decoded_payloads(history.to_json_dict())
    # The positive control: what the replica was told is readable here, so a secret would be.
    assert b"echo-0" in payloads
    assert str(weights).encode() in payloads
    for what, secret in secrets.items():
        assert secret.encode() not in payloads, f"the {what} is in the replica's history"
    raw = (system.state_dir / "temporal.db").read_bytes()
    assert b"echo-0" in raw
    for what, secret in secrets.items():
        assert secret.encode() not in raw, f"the {what} is in Temporal's database"


def decoded_payloads(node: object) -> bytes:
    """Every payload's bytes in a history (the JSON form base64-encodes them), joined."""
    if isinstance(node, dict):
        parts = [decoded_payloads(v) for v in node.values()]
        if isinstance(node.get("data"), str) and "metadata" in node:
            parts.append(base64.b64decode(node["data"]))
        return b"\n".join(parts)
    if isinstance(node, list):
        return b"\n".join(decoded_payloads(v) for v in node)
    return b""


async def test_temporal_killed_is_restarted_and_nothing_is_lost(
    system: System, weights: Path, tmp_path: Path
) -> None:
    own = tmp_path / "durable.gguf"
    own.write_bytes(weights.read_bytes())
    system.cli("model", "add", "durable", "--weights", str(own), "--cpu-cores", "1")
    await wait_ready(system, "durable", 1)
    os.kill(system.child_pid("temporal"), signal.SIGKILL)
    # The gateway keeps serving from its last routing table while Temporal is down.
    assert chat(system, "durable")
    wait_for(lambda: any("Temporal exited" in line for line in system.output), 30, "a restart")
    # The workflows come back from the SQLite file and still take commands.
    system.cli("model", "scale", "durable", "0")
    await system.until(lambda: system.released("durable"), 90, "durable to release")
    wait_for(lambda: not system.engine_processes(str(own)), 30, "its engine to stop")
    system.cli("model", "rm", "durable")
