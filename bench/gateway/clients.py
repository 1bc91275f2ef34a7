"""Which HTTP client the gateway's upstream hop should use, by CPU per request (issue 35):

    python -m bench.gateway.clients [--duration 5] [--concurrency 16] [--json FILE]

Each client posts the same chat completion to the stand-in upstream (bench/gateway/standin.py,
in its own process on the other core) from this process, pinned alone to one core, and reads
the whole answer: a plain JSON one, then an SSE stream of 16 chunks. The CPU this process spends
per request is the client's cost plus the event loop's, the same loop (uvloop) for each:

  aiohttp  aiohttp.ClientSession configured as the gateway's (gateway/app.py): what it uses now;
  httpx    httpx.AsyncClient, no connection limit;
  llmgw    the gateway's own client for engines on plain http (gateway/upstream_http.py): a
           keep-alive pool of asyncio Protocols parsing answers with httptools (uvicorn's
           parser), chosen by this benchmark from a bare version of itself, and the gateway's
           hop since.

A command, not a test: it prints each client's figures and their ratios to aiohttp's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import httpx
import uvloop

from bench.gateway.procs import Child, Cores, pin_self, port_open, wait_until
from engines.local_port import free_port
from gateway.upstream_http import UpstreamPool

HOST = "127.0.0.1"
PATH = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Say hi."}]
CLIENTS = ("aiohttp", "httpx", "llmgw")
# One request: POST the body, read the whole answer; returns the answer's size.
Post = Callable[[bytes], Awaitable[int]]


@dataclass(frozen=True)
class ClientFigures:
    client: str
    shape: str  # plain or stream
    requests: int
    cpu_us_per_request: float
    requests_per_s: float


async def _measure(
    post: Post, body: bytes, concurrency: int, warmup_s: float, duration_s: float
) -> tuple[int, float, float]:
    """(requests, CPU seconds of this process, wall seconds) in the window after the warm-up."""
    loop = asyncio.get_running_loop()
    counting = False
    count = 0
    stop = loop.time() + warmup_s + duration_s

    async def worker() -> None:
        nonlocal count
        while loop.time() < stop:
            await post(body)
            if counting:
                count += 1

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(warmup_s)
    counting, cpu0, wall0 = True, time.process_time(), time.perf_counter()
    await asyncio.sleep(duration_s)
    counting = False
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await asyncio.gather(*workers)
    return count, cpu, wall


async def _client(name: str, url: str, port: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer b"}
    if name == "aiohttp":
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600),
            connector=aiohttp.TCPConnector(limit=0),
            trust_env=False,
        )

        async def post_aiohttp(body: bytes) -> int:
            async with session.post(url, data=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}")
                size = 0
                async for chunk in r.content.iter_any():
                    size += len(chunk)
                return size

        return post_aiohttp, session.close
    if name == "httpx":
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None), trust_env=False)

        async def post_httpx(body: bytes) -> int:
            async with client.stream("POST", url, content=body, headers=headers) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"status {r.status_code}")
                size = 0
                async for chunk in r.aiter_raw():
                    size += len(chunk)
                return size

        return post_httpx, client.aclose
    pool = UpstreamPool(10, 600, 4)
    host_header = f"{HOST}:{port}"

    async def post_llmgw(body: bytes) -> int:
        answer = await pool.post(HOST, port, host_header, PATH, headers, body)
        if answer.status != 200:
            raise RuntimeError(f"status {answer.status}")
        size = 0
        async for chunk in answer.content.iter_any():
            size += len(chunk)
        return size

    return post_llmgw, pool.close


async def _run_all(
    port: int, clients: tuple[str, ...], concurrency: int, warmup_s: float, duration_s: float
) -> list[ClientFigures]:
    url = f"http://{HOST}:{port}{PATH}"
    figures = []
    for stream in (False, True):
        body = json.dumps({"model": "mock", "messages": MESSAGES, "stream": stream}).encode()
        sizes: dict[str, int] = {}
        for name in clients:
            post, close = await _client(name, url, port)
            try:
                # Every client must read the same answer (the stream de-chunked): else its
                # figure would be for less work.
                sizes[name] = await post(body)
                if len(set(sizes.values())) > 1:
                    raise RuntimeError(f"the clients read different answers: {sizes}")
                count, cpu, wall = await _measure(post, body, concurrency, warmup_s, duration_s)
            finally:
                await close()
            shape = "stream" if stream else "plain"
            per = cpu / count * 1e6 if count else float("nan")
            figures.append(ClientFigures(name, shape, count, per, count / wall))
            print(f"  {name:8} {shape:6} {count / wall:9,.0f} req/s  CPU {per:6.0f} us each")
    return figures


def lines(figures: list[ClientFigures]) -> list[str]:
    """The table and each client's CPU per request as a ratio of aiohttp's."""
    out = ["client    shape   req/s   CPU us/req  x aiohttp"]
    base = {f.shape: f.cpu_us_per_request for f in figures if f.client == "aiohttp"}
    for f in figures:
        ratio = f.cpu_us_per_request / base[f.shape] if f.shape in base else float("nan")
        out.append(
            f"{f.client:9} {f.shape:6} {f.requests_per_s:7,.0f}  {f.cpu_us_per_request:10.0f}"
            f"  {ratio:8.2f}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.clients")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--only", default=",".join(CLIENTS), help="comma-separated clients")
    parser.add_argument("--json", dest="json_out", type=Path)
    args = parser.parse_args(argv)
    clients = tuple(c for c in args.only.split(",") if c)
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        parser.error(f"unknown clients: {', '.join(sorted(unknown))}")
    cores = Cores.pick()
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        argv_standin = [sys.executable, "-m", "bench.gateway.standin", "--port", str(port)]
        standin = Child("standin", argv_standin, Path(work) / "standin.log", cores.load)
        try:
            wait_until(standin, lambda: port_open(port), 30.0)
            pin_self(cores.proxy)
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                figures = runner.run(
                    _run_all(port, clients, args.concurrency, args.warmup, args.duration)
                )
        finally:
            standin.stop()
    print()
    print("\n".join(lines(figures)))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps([asdict(f) for f in figures], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
