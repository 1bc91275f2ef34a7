"""Running the gateway for real, for tests that talk to it as a client would: a uvicorn server
on an ephemeral port (in this process or in a subprocess of its own), a real SQLite store, a
fake route source, real upstreams, and raw sockets for what an HTTP client would tidy up.

`python -m tests.gateway_kit --state-dir D --upstream URL` is the subprocess: it serves the
gateway under uvloop, as `llmgw gateway` would, and prints one JSON line saying where and with
which key once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from aiohttp import web

from gateway.http_limits import limited_protocol
from gateway.server import http_limits, listen, uvicorn_config
from gateway.settings import GatewaySettings
from store import Store, open_store
from tests import standin_engine
from tests.ports import free_port
from workflows.contracts import ModelSpec, ModelView, ReplicaState, Route, RoutingTable

STANDIN = Path(__file__).resolve().parent / "standin_engine.py"
REPO = Path(__file__).resolve().parents[1]
NODE = "node-a"
MODEL = "smol"
TIMEOUT = httpx.Timeout(15.0)


def route(replica_id: str, endpoint: str, state: ReplicaState = ReplicaState.READY) -> Route:
    return Route(
        replica_id=replica_id,
        model=MODEL,
        node=NODE,
        endpoint=endpoint,
        engine="llamacpp",
        state=state,
    )


class FakeRouteSource:
    """Stands in for the ledger query; counts calls so a test can tell when the gateway asks."""

    def __init__(self, *routes: Route) -> None:
        self.table = RoutingTable(version=1, routes=list(routes))
        self.fetches = 0

    async def fetch(self) -> RoutingTable:
        self.fetches += 1
        return self.table


# --- upstreams ---------------------------------------------------------------------------


def start_standin(tmp: Path, keys: list[str], env: dict[str, str] | None = None) -> tuple[str, Any]:
    weights = tmp / "model.gguf"
    weights.write_bytes(b"GGUF")
    port = free_port()
    command = [sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "-m", str(weights), "--load-delay", "0"],
        env={**os.environ, "LLAMA_API_KEY": ",".join(keys), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1, trust_env=False).status_code == 200:
                return url, proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the stand-in engine did not come up")


def stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class Recorder:
    """An upstream that answers one fixed chat completion and keeps every request it got."""

    url: str = ""
    seen: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving_vllm(tokenize: Handler, chat: Handler, metrics: Handler) -> AsyncIterator[str]:
    """A vLLM stand-in's three routes the gateway uses for KV routing (/tokenize, chat
    completions, /metrics), served on loopback; its URL."""
    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    async with serving(app) as url:
        yield url


@asynccontextmanager
async def recording_upstream() -> AsyncIterator[Recorder]:
    recorder = Recorder()

    async def chat(request: web.Request) -> web.Response:
        recorder.seen.append((dict(request.headers), await request.json()))
        return web.json_response(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serving(app) as url:
        recorder.url = url
        yield recorder


# --- the gateway -------------------------------------------------------------------------


@dataclass
class Gateway:
    url: str
    client: httpx.AsyncClient
    store: Store
    source: FakeRouteSource
    key_id: str
    api_key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    async def chat(self, **body: Any) -> httpx.Response:
        body.setdefault("model", MODEL)
        body.setdefault("messages", [{"role": "user", "content": "tell me about otters"}])
        return await self.client.post("/v1/chat/completions", json=body, headers=self.auth)

    async def usage_totals(self, expect_requests: int, timeout: float = 5.0) -> tuple[int, int]:
        """(prompt, completion) tokens once the store shows `expect_requests` requests."""
        deadline = time.monotonic() + timeout
        while True:
            rows = await self.store.usage(key_id=self.key_id)
            if sum(r.requests for r in rows) >= expect_requests or time.monotonic() > deadline:
                assert sum(r.requests for r in rows) == expect_requests
                return (
                    sum(r.prompt_tokens for r in rows),
                    sum(r.completion_tokens for r in rows),
                )
            await asyncio.sleep(0.05)


def fast_settings(**overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "refresh_interval_s": 0.05,
        "key_refresh_interval_s": 0.1,
        "usage_flush_interval_s": 0.1,
        "upstream_read_timeout_s": 10,
    }
    return GatewaySettings(**{**values, **overrides})


@asynccontextmanager
async def running_gateway(
    store: Store, source: FakeRouteSource, settings: GatewaySettings | None = None
) -> AsyncIterator[Gateway]:
    settings = settings or fast_settings()
    record, plaintext = await store.create_key(f"test-{uuid.uuid4().hex[:8]}")
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(settings, store, source))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    client = httpx.AsyncClient(base_url=url, timeout=TIMEOUT, trust_env=False)
    try:
        yield Gateway(url, client, store, source, record.key_id, plaintext)
    finally:
        await client.aclose()
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in response.text
    if code is not None:
        assert body["error"]["code"] == code


async def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] async for line in response.aiter_lines() if line]


class CatalogSource(FakeRouteSource):
    """A route source that also keeps model definitions, as the ledger does (PUT and GET
    /admin/v1/models)."""

    def __init__(self, *routes: Route) -> None:
        super().__init__(*routes)
        self.applied: list[ModelSpec] = []

    async def apply_model(self, spec: ModelSpec) -> ModelView:
        self.applied = [s for s in self.applied if s.name != spec.name] + [spec]
        return ModelView(spec=spec)

    async def list_models(self) -> list[ModelView]:
        return [ModelView(spec=s) for s in self.applied]


# --- an upstream that records, in this process ---------------------------------------------


@dataclass
class Upstream:
    """The llama-server stand-in's own handlers (tests/standin_engine.py), served in this
    process with /v1/embeddings added, keeping every request that reached it."""

    url: str = ""
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)  # method, path, body


async def _embeddings(request: web.Request) -> web.Response:
    body = await request.json()
    texts = body.get("input", "")
    count = len(texts) if isinstance(texts, list) else 1
    data = [{"object": "embedding", "index": i, "embedding": [0.0, 1.0]} for i in range(count)]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": body.get("model", ""),
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }
    )


@asynccontextmanager
async def recording_standin(tmp: Path) -> AsyncIterator[Upstream]:
    upstream = Upstream()

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        upstream.seen.append((request.method, request.path, await request.read()))
        response: web.StreamResponse = await handler(request)
        return response

    weights = tmp / "upstream.gguf"
    weights.write_bytes(b"GGUF")
    args = standin_engine.parse_args(["-m", str(weights), "--load-delay", "0"])
    saved = os.environ.pop("LLAMA_API_KEY", None)  # no engine key: any caller is served
    try:
        app = standin_engine.build_app(args)
    finally:
        if saved is not None:
            os.environ["LLAMA_API_KEY"] = saved
    app.middlewares.insert(0, record)
    app.router.add_post("/v1/embeddings", _embeddings)
    async with serving(app) as url:
        upstream.url = url
        yield upstream


@contextmanager
def recording_standin_thread(tmp: Path) -> Iterator[Upstream]:
    """`recording_standin` on an event loop of its own thread, for tests that are not
    coroutines (schemathesis and hypothesis drive theirs synchronously)."""
    ready = threading.Event()
    held: dict[str, Any] = {}

    async def run() -> None:
        held["loop"], held["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with recording_standin(tmp) as upstream:
            held["upstream"] = upstream
            ready.set()
            await held["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    if not ready.wait(20):
        raise RuntimeError("the upstream stand-in did not start")
    try:
        yield held["upstream"]
    finally:
        held["loop"].call_soon_threadsafe(held["stop"].set)
        thread.join(10)


# --- the gateway in a process of its own ----------------------------------------------------


@dataclass
class GatewayProcess:
    """A gateway subprocess: its memory and its event loop are its own, so a test can read its
    RSS and load it from this process without measuring itself."""

    proc: subprocess.Popen[str]
    url: str  # on loopback
    port: int
    api_key: str
    key_id: str
    # The same gateway on a non-loopback address of this machine, when it has one.
    outside_url: str | None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def rss_bytes(self) -> int:
        return rss_bytes(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_gateway_process(
    state_dir: Path,
    upstream: str,
    *more_upstreams: str,
    body_timeout_s: float | None = None,
    timeout: float = 30,
) -> GatewayProcess:
    """The store in `state_dir` is shared: this process may open it too (keys, usage), and
    other gateway processes on it are its peers (gateway/peers/). Each upstream is a replica
    of the model `smol`: smol-0, smol-1, ... in order."""
    command = [sys.executable, "-m", "tests.gateway_kit"]
    command += ["--state-dir", str(state_dir)]
    for url in (upstream, *more_upstreams):
        command += ["--upstream", url]
    if body_timeout_s is not None:
        command += ["--body-timeout-s", str(body_timeout_s)]
    outside = non_loopback_address()
    if outside:
        command += ["--outside", outside]
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        if line.startswith("{"):
            break
    if not line.startswith("{"):
        proc.kill()
        raise RuntimeError("the gateway subprocess did not come up")
    info = json.loads(line)
    return GatewayProcess(
        proc=proc,
        url=info["url"],
        port=info["port"],
        api_key=info["api_key"],
        key_id=info["key_id"],
        outside_url=info.get("outside_url"),
    )


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, "no VmRSS in /proc/<pid>/status"
    return int(match.group(1)) * 1024


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, found without sending anything
    (connecting a UDP socket only picks the route); None on a machine with none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))  # TEST-NET-1: never answered, only routed
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


# --- raw HTTP ------------------------------------------------------------------------------


@dataclass
class RawReply:
    data: bytes
    closed: bool  # the server closed the connection (EOF or reset) before the time ran out
    seconds: float

    @property
    def status(self) -> int | None:
        match = re.match(rb"HTTP/1\.[01] (\d{3}) ", self.data)
        return int(match.group(1)) if match else None

    @property
    def body(self) -> bytes:
        return self.data.partition(b"\r\n\r\n")[2]

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_exchange(
    url: str,
    request: bytes,
    *,
    local_host: str | None = None,
    timeout: float = 10,
    read_until_close: bool = False,
) -> RawReply:
    """Send bytes exactly as given and read back what comes: the first complete response
    (by Content-Length), or everything until the server closes when `read_until_close`."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    started = time.perf_counter()
    local = (local_host, 0) if local_host else None
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=local)
    data = b""
    closed = False
    try:
        writer.write(request)
        await writer.drain()
        deadline = started + timeout
        while time.perf_counter() < deadline:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), deadline - time.perf_counter())
            except TimeoutError:
                break
            except ConnectionError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            data += chunk
            if not read_until_close and complete_response(data):
                break
    finally:
        writer.close()
    return RawReply(data, closed, time.perf_counter() - started)


def complete_response(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    match = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    return match is not None and len(body) >= int(match.group(1))


def http_request(
    method: str,
    path: str,
    *,
    host: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body and not any(k.lower() == "content-length" for k in headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# --- the subprocess ------------------------------------------------------------------------


async def _serve_subprocess(args: argparse.Namespace) -> None:
    store = open_store(None, Path(args.state_dir))
    await store.init()
    record, plaintext = await store.create_key(f"proc-{uuid.uuid4().hex[:8]}")
    sockets = [socket.create_server(("127.0.0.1", 0))]
    if args.outside:
        sockets.append(socket.create_server((args.outside, 0)))
    settings = fast_settings(host="127.0.0.1")
    source = CatalogSource(*(route(f"smol-{i}", url) for i, url in enumerate(args.upstream)))
    config = uvicorn_config(settings, store, source)
    if args.body_timeout_s is not None:
        # The production protocol with one limit shortened, so a test need not wait a minute.
        limits = replace(http_limits(settings), body_timeout_s=args.body_timeout_s)
        config.http = limited_protocol(limits)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=sockets))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = sockets[0].getsockname()[1]
    info: dict[str, Any] = {
        "url": f"http://127.0.0.1:{port}",
        "port": port,
        "api_key": plaintext,
        "key_id": record.key_id,
    }
    if args.outside:
        info["outside_url"] = f"http://{args.outside}:{sockets[1].getsockname()[1]}"
    print(json.dumps(info), flush=True)
    try:
        await task
    finally:
        await store.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--upstream", required=True, action="append")
    parser.add_argument("--outside", default="")
    parser.add_argument("--body-timeout-s", type=float, default=None)
    args = parser.parse_args(argv)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve_subprocess(args))


if __name__ == "__main__":
    main(sys.argv[1:])
