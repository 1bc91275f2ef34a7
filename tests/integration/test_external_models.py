"""An external model through the whole system: defined with `llmgw model add --engine external`
on a running `llmgw up`, used with the unchanged `openai` client (tools, JSON mode, streaming
with usage, embeddings), its upstream key sent only to it, metered per key, exported as CSV; and
one whose engine publishes KV-cache events, to which the gateway subscribes."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import openai
import pytest
import zmq
from aiohttp import web
from openai.types.chat import ChatCompletionFunctionToolParam

from tests.ports import free_port
from tests.system import System, wait_for

pytestmark = pytest.mark.integration

UPSTREAM_KEY = "sk-upstream-only"


class OpenAICompatible:
    """A tiny OpenAI-compatible endpoint in a thread of its own: it answers chat (plain and
    streamed) and embeddings, and keeps what each request carried."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.path, dict(request.headers), body))
        usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
        if not body.get("stream"):
            message = {"role": "assistant", "content": '{"answer": 42}'}
            return web.json_response(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in ("forty", "-two"):
            chunk = {
                "id": "c2",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
            }
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        tail = {"id": "c2", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        await response.write(
            b"data: " + json.dumps({**tail, "choices": [], "usage": usage}).encode() + b"\n\n"
        )
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((request.path, dict(request.headers), body))
        return web.json_response(
            {
                "object": "list",
                "model": body["model"],
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}],
                "usage": {"prompt_tokens": 3, "total_tokens": 3},
            }
        )

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> OpenAICompatible:
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAICompatible]:
    with OpenAICompatible() as endpoint:
        yield endpoint


def test_an_external_model_serves_the_openai_client_unchanged(
    system: System, upstream: OpenAICompatible, tmp_path: Path
) -> None:
    key_file = tmp_path / "upstream.key"
    key_file.write_text(UPSTREAM_KEY + "\n")
    system.cli(
        "model", "add", "mock", "--engine", "external", "--url", upstream.url,
        "--upstream-key-file", str(key_file), "--upstream-model", "org/Mock-7B:v1",
    )  # fmt: skip
    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)

    def routed() -> bool:
        return "mock" in [m.id for m in client.models.list()]

    wait_for(routed, 30, "the external model in /v1/models")

    tools: list[ChatCompletionFunctionToolParam] = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up.",
                "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
            },
        }
    ]
    reply = client.chat.completions.create(
        model="mock",
        messages=[{"role": "user", "content": "what is the answer?"}],
        tools=tools,
        tool_choice="auto",
        response_format={"type": "json_object"},
    )
    assert json.loads(reply.choices[0].message.content or "") == {"answer": 42}
    assert reply.usage is not None
    assert reply.usage.total_tokens == 9

    chunks = list(
        client.chat.completions.create(
            model="mock",
            messages=[{"role": "user", "content": "stream it"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "forty-two"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 2

    embedding = client.embeddings.create(model="mock", input="otters")
    assert embedding.data[0].embedding == [0.5, 0.25]

    paths = [path for path, _, _ in upstream.seen]
    assert paths == ["/v1/chat/completions", "/v1/chat/completions", "/v1/embeddings"]
    # The endpoint is asked for the model by its own name; clients use llmgw's.
    assert [body["model"] for _, _, body in upstream.seen] == ["org/Mock-7B:v1"] * 3
    plain = upstream.seen[0][2]
    assert plain["tools"] == tools, "tools pass through untouched"
    assert plain["response_format"] == {"type": "json_object"}
    for _, headers, _ in upstream.seen:
        assert headers["Authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert system.api_key not in json.dumps(headers)

    def metered() -> bool:
        rows = list(csv.DictReader(io.StringIO(system.cli("usage", "--csv").stdout)))
        mock = [r for r in rows if r["model"] == "mock"]
        return bool(mock) and int(mock[0]["requests"]) == 3

    wait_for(metered, 15, "three requests of mock in `llmgw usage --csv`")
    rows = list(csv.DictReader(io.StringIO(system.cli("usage", "--csv").stdout)))
    mock = next(r for r in rows if r["model"] == "mock")
    assert int(mock["total_tokens"]) == 9 + 9 + 3

    system.cli("model", "rm", "mock")

    def gone() -> bool:
        return "mock" not in [m.id for m in client.models.list()]

    wait_for(gone, 30, "the external model gone after rm")


class Publisher:
    """A stand-in external vLLM's KV-event publisher: a PUB bound on loopback (the engine's
    wildcard endpoint), sending one BlockStored batch after another from a thread."""

    def __init__(self, endpoint: str, blocks: list[int]) -> None:
        self._endpoint = endpoint
        self._blocks = blocks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(self._endpoint)
        stored = {"type": "BlockStored", "block_hashes": self._blocks, "token_ids": [1]}
        payload = msgpack.packb([0.0, [{**stored, "block_size": 1}], 0])
        while not self._stop.wait(0.1):
            # Sequence 0 again and again (a publisher restarting each time): whenever the
            # gateway connects, the next batch it hears gives it the same blocks.
            pub.send_multipart([b"", (0).to_bytes(8, "big"), payload])
        pub.close()
        ctx.term()

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_an_external_models_kv_events_reach_the_gateway(
    system: System, upstream: OpenAICompatible
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    admin = httpx.Client(base_url=f"http://127.0.0.1:{system.admin_port}", trust_env=False)
    with Publisher(endpoint, [11, 12, 13]), admin:
        system.cli(
            "model", "add", "fleet", "--engine", "external", "--url", upstream.url,
            "--kv-event-source", endpoint, "--kv-block-size", "16", "--kv-hash-seed", "0",
        )  # fmt: skip
        shown: dict[str, Any] = {}

        def indexed() -> bool:
            shown.update(admin.get("/admin/v1/kv").json())
            sizes: dict[str, int] = shown["replicas"]  # blocks indexed, by replica
            return sizes.get("fleet/ext-0") == 3

        wait_for(indexed, 30, "the external engine's blocks in GET /admin/v1/kv")
        (subscription,) = [p for p in shown["publishers"] if p["publisher"] == endpoint]
        assert subscription["connected"] is True
        assert subscription["replicas"] == ["fleet/ext-0"]

        system.cli("model", "rm", "fleet")

        def stopped() -> bool:
            shown.update(admin.get("/admin/v1/kv").json())
            return not shown["publishers"] and "fleet/ext-0" not in shown["replicas"]

        wait_for(stopped, 30, "the subscription stopped after rm")
