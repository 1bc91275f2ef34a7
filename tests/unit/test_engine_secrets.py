"""Secret env values are referenced by name and resolved by the agent at launch: never in a
model definition (so never in a workflow history), and a missing one fails the launch by name."""

import asyncio
import io
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agent.node_agent import NodeAgentActivities
from activities.agent.node_secrets import main as secret_cli
from activities.agent.node_secrets import read_secret, set_secret
from tests.ports import free_port
from tests.unit.test_node_agent import (
    STANDIN,
    make_config,
    venv_python_first,  # noqa: F401 - autouse, for the stand-in
)
from workflows.catalog import check_profile
from workflows.contracts import Allocation, LaunchRequest, ModelSpec, Profile

TOKEN = "hf_live_0123456789abcdef"


def env_problems(env: dict[str, str]) -> list[str]:
    return check_profile(Profile(engine="llamacpp", memory_mb=512, env=env))


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"],
)
def test_a_plain_value_for_a_secret_looking_name_is_refused_with_how_to_reference_one(
    name: str,
) -> None:
    (problem,) = env_problems({name: TOKEN, "OMP_NUM_THREADS": "4"})
    assert problem.startswith(f"env.{name}: looks like a secret")
    assert "llmgw secret set" in problem
    assert f"{name}: secret:" in problem
    assert TOKEN not in problem


def test_a_secret_reference_is_accepted_and_a_bad_name_is_not() -> None:
    assert env_problems({"HF_TOKEN": "secret:hf-token", "NCCL_IB_PKEY": "0x8001"}) == []
    (problem,) = env_problems({"HF_TOKEN": "secret:HF Token"})
    assert problem.startswith("env.HF_TOKEN: secret name 'HF Token' must be")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgentActivities]:
    config = replace(make_config(tmp_path), engine_paths={"llamacpp": str(STANDIN)})
    acts = NodeAgentActivities(config)
    yield acts
    acts.stop_all_engines()


def request(tmp_path: Path, env: dict[str, str]) -> LaunchRequest:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF")
    port = free_port()
    return LaunchRequest(
        replica_id="m-0",
        workflow_id="replica:m:0",
        # Built without validation, as an old definition or a direct sender could.
        model=ModelSpec(name="m", weights=str(weights), profiles=[Profile(env=env)]),
        allocation=Allocation(
            replica_id="m-0",
            node="node-a",
            address="127.0.0.1",
            port=port,
            cpu_cores=2,
            memory_mb=1024,
        ),
    )


async def engine_environ(pid: int) -> dict[str, str]:
    for _ in range(100):  # the stand-in execs python: environ reads empty for a moment
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        if env:
            return env
        await asyncio.sleep(0.05)
    raise AssertionError("engine environment never readable")


async def test_the_engine_gets_the_secret_and_nothing_returned_or_recorded_holds_it(
    agent: NodeAgentActivities, tmp_path: Path
) -> None:
    set_secret(agent._config.secrets_dir, "hf-token", TOKEN)
    req = request(tmp_path, {"HF_TOKEN": "secret:hf-token"})
    assert TOKEN not in req.model_dump_json()  # what a workflow history would hold
    launched = await ActivityEnvironment().run(agent.start_engine, req)
    assert (await engine_environ(launched.pid))["HF_TOKEN"] == TOKEN
    assert TOKEN not in launched.model_dump_json()
    shards_dir = agent._config.agent_dir / "shards"
    assert all(TOKEN not in p.read_text() for p in shards_dir.glob("*.json"))


async def test_a_missing_secret_fails_the_launch_by_name_without_retry(
    agent: NodeAgentActivities, tmp_path: Path
) -> None:
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(
            agent.start_engine, request(tmp_path, {"HF_TOKEN": "secret:hf-token"})
        )
    assert raised.value.non_retryable
    assert raised.value.type == "SecretMissing"
    assert "env HF_TOKEN: secret 'hf-token' is not set on this node" in str(raised.value)
    assert "node-a" in str(raised.value)
    assert agent.supervisor.shards() == []


async def test_a_secret_others_can_read_is_refused(
    agent: NodeAgentActivities, tmp_path: Path
) -> None:
    set_secret(agent._config.secrets_dir, "hf-token", TOKEN)
    (agent._config.secrets_dir / "hf-token").chmod(0o644)
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(
            agent.start_engine, request(tmp_path, {"HF_TOKEN": "secret:hf-token"})
        )
    assert raised.value.type == "SecretUnsafe"
    assert raised.value.non_retryable
    assert TOKEN not in str(raised.value)


def test_the_secret_command_sets_0600_files_and_removes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = tmp_path / "secrets"
    monkeypatch.setattr(sys, "stdin", io.StringIO(TOKEN + "\n"))
    assert secret_cli(["set", "hf-token"], secrets) == 0
    assert (secrets / "hf-token").stat().st_mode & 0o777 == 0o600
    assert secrets.stat().st_mode & 0o777 == 0o700
    assert read_secret(secrets, "hf-token") == TOKEN
    assert secret_cli(["rm", "hf-token"], secrets) == 0
    assert not (secrets / "hf-token").exists()
    assert TOKEN not in capsys.readouterr().out
