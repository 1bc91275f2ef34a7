"""TensorRT-LLM's key guard (engines/key_guard.py), run for real as the launcher runs it
(`python -I`, the key in its environment) in front of a stand-in trtllm-serve on loopback: it
answers only to the engine key (/health aside), relays bodies both ways, streams SSE as it
comes, says 502 when the engine is not there, and hangs up on the engine when the client goes.
The agent's own readiness probe and metrics scrape are run through it too."""

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from aiohttp import web

from activities.agent.readiness import wait_ready
from engines.key_guard import KEY_ENV, MAX_HEAD
from engines.metrics import scrape
from engines.trtllm import KEY_GUARD
from tests.ports import free_port

KEY = "llmgw-engine-5e3c"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Engine:
    """A stand-in trtllm-serve: what it was asked, and a stream it holds until released."""

    port: int
    seen: list[dict[str, str]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def echo(request: web.Request) -> web.Response:
            body = await request.read()
            self.seen.append(
                {"path": request.path_qs, "body": body.decode(), **dict(request.headers)}
            )
            return web.json_response({"path": request.path_qs, "body": body.decode()})

        async def stream(request: web.Request) -> web.StreamResponse:
            self.seen.append({"path": request.path_qs})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: first\n\n")
            while not self.release.is_set():  # the rest is held until the test says
                transport = request.transport
                if transport is None or transport.is_closing():
                    self.hung_up.set()
                    return response
                await asyncio.sleep(0.02)
            await response.write(b"data: rest\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="")

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(
                text="trtllm_num_requests_running 3\ntrtllm_num_requests_waiting 1\n"
            )

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/prometheus/metrics", metrics)
        app.router.add_post("/v1/stream", stream)
        app.router.add_route("*", "/v1/{tail:.*}", echo)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def start_guard(port: int, upstream: int, key: str = KEY) -> subprocess.Popen[str]:
    guard = subprocess.Popen(
        [
            sys.executable,
            "-I",
            str(KEY_GUARD),
            "--listen",
            f"127.0.0.1:{port}",
            "--upstream",
            f"127.0.0.1:{upstream}",
        ],
        env={KEY_ENV: key} if key else {},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and guard.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return guard
        except OSError:
            time.sleep(0.05)
    guard.kill()
    raise AssertionError(f"the guard did not listen: {guard.communicate()[0]}")


@pytest.fixture
def guard_port() -> int:
    return free_port()


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    stand_in = Engine(free_port())
    await stand_in.start()
    yield stand_in
    stand_in.release.set()
    await stand_in.stop()


@pytest.fixture
def guard(engine: Engine, guard_port: int) -> Iterator[str]:
    proc = start_guard(guard_port, engine.port)
    yield f"http://127.0.0.1:{guard_port}"
    proc.terminate()
    proc.wait(timeout=10)


async def test_no_key_or_a_wrong_one_is_refused_before_the_engine_sees_anything(
    guard: str, engine: Engine
) -> None:
    async with httpx.AsyncClient(base_url=guard, timeout=10) as client:
        for headers in (
            {},
            {"Authorization": "Bearer llmgw-engine-wrong"},
            {"Authorization": f"Basic {KEY}"},
            {"Authorization": f"Bearer {KEY}x"},
        ):
            response = await client.post("/v1/completions", headers=headers, json={"prompt": "hi"})
            assert response.status_code == 401, headers
            error = response.json()["error"]  # shaped as OpenAI's errors are
            assert error["type"] == "invalid_request_error"
            assert "key" in error["message"]
        assert (await client.get("/v1/models")).status_code == 401  # only /health is open
    assert engine.seen == []


async def test_the_right_key_is_relayed_with_its_body_and_the_key_goes_no_further(
    guard: str, engine: Engine
) -> None:
    async with httpx.AsyncClient(base_url=guard, timeout=10) as client:
        response = await client.post(
            "/v1/completions?x=1", headers=AUTH, json={"prompt": "hi" * 5000}
        )
        assert response.status_code == 200
        echoed = response.json()
        assert echoed["path"] == "/v1/completions?x=1"
        assert json.loads(echoed["body"]) == {"prompt": "hi" * 5000}
        assert response.headers["connection"] == "close"  # one request per connection

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"prompt": '
            yield b'"chunked"}'

        chunked = await client.post("/v1/chat/completions", headers=AUTH, content=chunks())
        assert chunked.json()["body"] == '{"prompt": "chunked"}'
    assert engine.seen[1].get("Transfer-Encoding") == "chunked"
    assert all("Authorization" not in seen for seen in engine.seen)


async def test_a_stream_arrives_event_by_event_while_the_engine_still_holds_the_rest(
    guard: str, engine: Engine
) -> None:
    async with (
        httpx.AsyncClient(base_url=guard, timeout=10) as client,
        client.stream("POST", "/v1/stream", headers=AUTH, json={"stream": True}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = response.aiter_raw()
        first = await asyncio.wait_for(anext(events), 5)
        assert not engine.release.is_set()  # the engine has sent only this much
        assert b"data: first" in first
        assert b"rest" not in first
        engine.release.set()
        rest = b"".join([chunk async for chunk in events])
    assert b"data: rest\n\n" in rest
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_a_client_that_hangs_up_hangs_up_the_engine(guard_port: int, engine: Engine) -> None:
    proc = start_guard(guard_port, engine.port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", guard_port)
        writer.write(
            f"POST /v1/stream HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Length: 2\r\n\r\n{}".encode()
        )
        received = b""
        while b"data: first" not in received:
            received += await asyncio.wait_for(reader.read(4096), 5)
        writer.close()  # gone before the engine finished
        await asyncio.wait_for(engine.hung_up.wait(), 5)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_health_needs_no_key_and_an_engine_not_there_is_a_502(guard_port: int) -> None:
    nobody = free_port()
    proc = start_guard(guard_port, nobody)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{guard_port}") as client:
            down = await client.post("/v1/completions", headers=AUTH, json={})
            assert down.status_code == 502
            assert down.json()["error"]["type"] == "server_error"
            assert (await client.get("/health")).status_code == 502  # relayed, not answered
            stand_in = Engine(nobody)
            await stand_in.start()
            try:
                assert (await client.get("/health")).status_code == 200
                assert (await client.get("/v1/models")).status_code == 401
            finally:
                await stand_in.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_agents_readiness_and_metrics_pass_with_the_key(guard_port: int) -> None:
    # The guard starts first: readiness sees 502s until trtllm-serve answers behind it.
    inner = free_port()
    proc = start_guard(guard_port, inner)
    stand_in = Engine(inner)
    try:

        async def engine_comes_up() -> None:
            await asyncio.sleep(0.5)
            await stand_in.start()

        up = asyncio.create_task(engine_comes_up())
        ready = await wait_ready(guard_port, KEY, 10, lambda: None, lambda: True, poll_s=0.05)
        await up
        assert ready.ready, ready.detail
        load = await scrape(f"http://127.0.0.1:{guard_port}/prometheus/metrics", KEY)
        assert load is not None
        assert (load.running, load.waiting) == (3, 1)
        assert await scrape(f"http://127.0.0.1:{guard_port}/prometheus/metrics", "wrong") is None
    finally:
        await stand_in.stop()
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    ("head", "status"),
    [
        # A bare LF an engine might read as a line end: a second request hidden in the first.
        (b"GET /health HTTP/1.1\r\nX: y\n\nGET /v1/models HTTP/1.1\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n", 431),
    ],
)
async def test_a_request_the_guard_cannot_check_is_refused(
    guard: str, engine: Engine, head: bytes, status: int
) -> None:
    port = int(guard.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(f"HTTP/1.1 {status} ".encode())
    assert engine.seen == []


def test_without_a_key_the_guard_does_not_start() -> None:
    done = subprocess.run(
        [sys.executable, "-I", str(KEY_GUARD), "--listen", "127.0.0.1:1", "--upstream", "x:2"],
        env={},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert f"no key in {KEY_ENV}" in done.stdout
