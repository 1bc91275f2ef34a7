"""The node agent's runtime LoRA loading (node_set_adapters): what it changes is decided from
what the engine serves, it reaches the engine's runtime endpoints with the engine key, and a
refusal, an engine without those endpoints or a missing engine fail clearly and for good.

The stand-in below answers as vLLM 0.32 does (vllm/entrypoints/serve/lora/api_router.py and
openai/models/serving.py): /v1 behind the key; the model list names each adapter with its
path as `root` and the base model as `parent`; loading a name it serves is a 400; unloading
one it does not is its own 404; without VLLM_ALLOW_RUNTIME_LORA_UPDATING the two paths do not
exist (FastAPI's 404, {"detail": "Not Found"})."""

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agent import procfs
from activities.agent.adapter_loading import adapter_changes, served_adapters
from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from activities.agent.supervisor import ShardSpec
from tests.ports import free_port
from workflows.artifact_names import COMPLETE_MARKER
from workflows.contracts import LoraAdapter, SetAdaptersRequest
from workflows.engine_keys import engine_key

SECRET = b"node-secret-for-tests-0123456789"
REPLICA = "m-0"
POEM_ARTIFACT = "sha256:" + "cd" * 32


def test_the_model_list_names_adapters_by_their_parent_and_path() -> None:
    listing = {
        "object": "list",
        "data": [
            {"id": "m", "root": "/w/m", "parent": None},
            {"id": "sql", "root": "/a/sql", "parent": "m"},
            {"id": "odd", "parent": "m"},  # no path: not one we can compare
        ],
    }
    assert served_adapters(listing) == {"sql": "/a/sql"}
    assert served_adapters({"error": "nope"}) == {}
    assert served_adapters([1, 2]) == {}


def test_changes_unload_what_is_gone_or_moved_then_load_what_is_missing() -> None:
    served = {"sql": "/a/sql", "old": "/a/old", "moved": "/a/v1"}
    wanted = {"sql": "/a/sql", "moved": "/a/v2", "poem": "/a/poem"}
    changes = adapter_changes(served, wanted)
    assert changes.unload == ["moved", "old"]
    assert changes.load == [("moved", "/a/v2"), ("poem", "/a/poem")]
    assert adapter_changes(wanted, wanted).load == []
    assert adapter_changes(wanted, wanted).unload == []


@dataclass
class StandinVllm:
    """What the stand-in engine serves and what it was asked."""

    adapters: dict[str, str] = field(default_factory=lambda: {"sql": "/a/sql"})
    runtime: bool = True  # started with VLLM_ALLOW_RUNTIME_LORA_UPDATING
    keys: set[str] = field(default_factory=set)
    port: int = 0


def standin_app(engine: StandinVllm) -> web.Application:
    key = f"Bearer {engine_key(SECRET, REPLICA)}"

    @web.middleware
    async def guard(request: web.Request, handler):  # type: ignore[no-untyped-def]
        engine.keys.add(request.headers.get("Authorization", ""))
        if request.path.startswith("/v1") and request.headers.get("Authorization") != key:
            return web.json_response({"error": "Unauthorized"}, status=401)
        if request.path.endswith("_lora_adapter") and not engine.runtime:
            return web.json_response({"detail": "Not Found"}, status=404)
        return await handler(request)

    def error(message: str, status: int) -> web.Response:
        return web.json_response({"error": {"message": message, "code": status}}, status=status)

    async def models(_: web.Request) -> web.Response:
        data = [{"id": "m", "root": "/w/m", "parent": None}]
        data += [{"id": n, "root": p, "parent": "m"} for n, p in engine.adapters.items()]
        return web.json_response({"object": "list", "data": data})

    async def load(request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        if name in engine.adapters:
            return error(f"The lora adapter '{name}' has already been loaded.", 400)
        if "rank64" in path:
            return error("LoRA rank 64 is greater than max_lora_rank 16.", 500)
        engine.adapters[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        if name not in engine.adapters:
            return error(f"The lora adapter '{name}' cannot be found.", 404)
        del engine.adapters[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application(middlewares=[guard])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/load_lora_adapter", load)
    app.router.add_post("/v1/unload_lora_adapter", unload)
    return app


@pytest.fixture
async def vllm() -> AsyncIterator[StandinVllm]:
    engine = StandinVllm(port=free_port())
    runner = web.AppRunner(standin_app(engine))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", engine.port).start()
    yield engine
    await runner.cleanup()


@pytest.fixture
def agent(tmp_path: Path) -> NodeAgentActivities:
    return NodeAgentActivities(
        AgentConfig(
            node="node-a",
            address="127.0.0.1",
            state_dir=tmp_path / "state",
            cache_dir=tmp_path / "cache",
            node_secret=SECRET,
        )
    )


def running(agent: NodeAgentActivities, port: int, engine: str = "vllm") -> None:
    """Record the replica's engine as running on `port` (this test's own process stands in for
    its pid, so the agent finds it alive)."""
    started = procfs.start_time(os.getpid())
    assert started is not None
    spec = ShardSpec(
        replica_id=REPLICA,
        workflow_id="replica:m:0",
        pid=os.getpid(),
        start_time=started,
        command=["vllm", "serve"],
        fingerprint="f",
        port=port,
        log_path="",
        engine=engine,
    )
    agent.supervisor._write_spec(spec)


def fetched_poem(tmp_path: Path) -> Path:
    directory = tmp_path / "state" / "artifacts" / ("cd" * 32)
    directory.mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(b"weights")
    (directory / COMPLETE_MARKER).write_text("")
    return directory


def ask(*adapters: LoraAdapter) -> SetAdaptersRequest:
    return SetAdaptersRequest(replica_id=REPLICA, model="m", adapters=list(adapters))


SQL = LoraAdapter(name="sql", path="/a/sql")
POEM = LoraAdapter(name="poem", path="", artifact=POEM_ARTIFACT)


async def test_the_engine_ends_up_serving_exactly_the_adapters_asked_for(
    agent: NodeAgentActivities, vllm: StandinVllm, tmp_path: Path
) -> None:
    running(agent, vllm.port)
    poem_dir = fetched_poem(tmp_path)
    env = ActivityEnvironment()
    result = await env.run(agent.set_adapters, ask(SQL, POEM))
    # The mirror's adapter is loaded from its artifact's directory on this node.
    assert vllm.adapters == {"sql": "/a/sql", "poem": str(poem_dir)}
    assert result.adapters == vllm.adapters
    assert (result.loaded, result.unloaded) == (["poem"], [])
    assert vllm.keys == {f"Bearer {engine_key(SECRET, REPLICA)}"}

    # Asked again (a retry after an agent restart): nothing to do.
    again = await env.run(agent.set_adapters, ask(SQL, POEM))
    assert (again.loaded, again.unloaded) == ([], [])

    # One removed, one moved to another path: unloaded, and loaded again from there.
    moved = POEM.model_copy(update={"artifact": "", "path": "/a/poem-v2"})
    result = await env.run(agent.set_adapters, ask(moved))
    assert vllm.adapters == {"poem": "/a/poem-v2"}
    assert (result.loaded, result.unloaded) == (["poem"], ["poem", "sql"])


async def test_an_adapter_the_engine_refuses_fails_for_good_naming_it(
    agent: NodeAgentActivities, vllm: StandinVllm
) -> None:
    running(agent, vllm.port)
    big = LoraAdapter(name="big", path="/a/rank64")
    with pytest.raises(ApplicationError, match=r"loading adapter big: HTTP 500 .*max_lora_rank"):
        await ActivityEnvironment().run(agent.set_adapters, ask(SQL, big))
    assert vllm.adapters == {"sql": "/a/sql"}


async def test_an_engine_without_runtime_endpoints_or_none_running_fails_for_good(
    agent: NodeAgentActivities, vllm: StandinVllm
) -> None:
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as gone:
        await env.run(agent.set_adapters, ask(SQL))
    assert (gone.value.type, gone.value.non_retryable) == ("EngineGone", True)

    running(agent, vllm.port)
    vllm.runtime = False  # started by an agent from before, without the variable
    with pytest.raises(ApplicationError, match="without runtime adapter loading") as old:
        await env.run(agent.set_adapters, ask(SQL, LoraAdapter(name="x", path="/a/x")))
    assert (old.value.type, old.value.non_retryable) == ("NoRuntimeAdapters", True)

    # An adapter from the mirror not fetched here yet.
    vllm.runtime = True
    with pytest.raises(ApplicationError, match="not fetched") as unfetched:
        await env.run(agent.set_adapters, ask(SQL, POEM))
    assert unfetched.value.type == "WeightsMissing"

    # llama-server's adapters are given at launch only.
    running(agent, vllm.port, engine="llamacpp")
    with pytest.raises(ApplicationError, match="only at launch") as launch_time:
        await env.run(agent.set_adapters, ask(SQL))
    assert launch_time.value.type == "NoRuntimeAdapters"
