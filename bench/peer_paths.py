"""Which path should carry what one gateway tells the others (gateway/peers/)? Each candidate
carries the same stream of messages, one every `--every-ms`, from a sender to a receiver in this
process, and the delay of each (receipt minus send, one clock) is reported with what the path
costs while it idles:

  peer bus         the real thing: two PeerBus instances on one SQLite store; a router decision
                   on one, timed until the other's picture has applied it (10 ms flushes)
  store, SQLite    a row per message in a table of a SQLite file; the receiver polls for rows
                   past the last id it read, every --poll-ms
  store, Postgres  the same on PostgreSQL (--database-url; skipped without one)
  agent feed       two HTTP hops as a node agent's feed would take them: the sender POSTs to a
                   relay (aiohttp), which writes a line to the NDJSON stream the receiver reads

The relay stands in for a node agent: the real feed (kv/feed.py) carries engine events,
not gateways' messages. Everything runs on one event loop of one process, so each delay also
holds the other side's turn on the loop: a bound on what separate machines would see, not a
floor.

    .venv/bin/python -m bench.peer_paths [--messages 400 --every-ms 5 --poll-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.peers.bus import PeerBus
from gateway.routing import RequestKey, Router, RoutingSnapshot
from gateway.routing.prefix_index import PrefixIndex
from store import open_store
from workflows.contracts import ReplicaState, Route, RoutingTable
from workflows.engine_keys import peer_bus_key, prefix_hash_key

ROUTES = RoutingSnapshot(
    RoutingTable(
        version=1,
        routes=[
            Route(
                replica_id=f"r-{n}",
                model="m",
                node="n",
                endpoint=f"http://127.0.0.1:1/{n}",
                engine="llamacpp",
                state=ReplicaState.READY,
            )
            for n in range(4)
        ],
    )
)
Delays = list[float]


def summary(name: str, delays: Delays, cost: str) -> str:
    ms = sorted(d * 1000 for d in delays)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"| {name} | {statistics.median(ms):.1f} | {p99:.1f} | {max(ms):.1f} | {cost} |"


async def paced(count: int, every_s: float, send: Callable[[int], Any]) -> None:
    for n in range(count):
        await send(n)
        await asyncio.sleep(every_s)


async def peer_bus(count: int, every_s: float) -> Delays:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(None, Path(tmp))
        await store.init()
        master = await store.master_secret()

        async def started() -> PeerBus:
            router = Router(index=PrefixIndex(hash_key=prefix_hash_key(master)))
            bus = PeerBus(store, router, dict, peer_bus_key(master), "127.0.0.1")
            await bus.start()
            return bus

        a = await started()
        b = await started()
        await a.announce()
        sent_at: dict[int, float] = {}
        delays: Delays = []
        original = b.picture.batch

        def timed(name: str, seq: int, items: list[list[Any]], now: float) -> bool:
            arrived = time.perf_counter()
            for item in items:
                if item[0] == "p" and item[2][0] in sent_at:
                    delays.append(arrived - sent_at.pop(item[2][0]))
            return original(name, seq, items, now)

        b.picture.batch = timed  # type: ignore[method-assign]

        async def send(n: int) -> None:
            prompt = f"prompt {n:06d} ".encode() * 64
            keys = a.picture.router.index.hashes(prompt)
            sent_at[keys[0]] = time.perf_counter()
            a.picture.router.choose(ROUTES, RequestKey("m", prompt), {})

        await paced(count, every_s, send)
        await asyncio.sleep(0.5)
        await b.close()
        await a.close()
        await store.close()
        return delays


async def sqlite_store(count: int, every_s: float, poll_s: float) -> tuple[Delays, int]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "paths.db"
        writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, sent REAL, body TEXT)")
        reader = sqlite3.connect(path, isolation_level=None)

        async def send(n: int) -> None:
            body = json.dumps(["p", f"r-{n % 4}", list(range(16))])
            await asyncio.to_thread(
                writer.execute,
                "INSERT INTO m (sent, body) VALUES (?, ?)",
                (time.perf_counter(), body),
            )

        def read(last: int) -> list[tuple[int, float]]:
            rows = reader.execute("SELECT id, sent FROM m WHERE id > ? ORDER BY id", (last,))
            return [(int(i), float(s)) for i, s in rows.fetchall()]

        delays, polls = await _poll_while(count, every_s, poll_s, send, read)
        writer.close()
        reader.close()
        return delays, polls


async def postgres_store(url: str, count: int, every_s: float, poll_s: float) -> tuple[Delays, int]:
    import asyncpg

    conn = await asyncpg.connect(url)
    polled = await asyncpg.connect(url)
    await conn.execute("DROP TABLE IF EXISTS bench_peer_paths")
    await conn.execute(
        "CREATE TABLE bench_peer_paths (id BIGSERIAL PRIMARY KEY, sent DOUBLE PRECISION, body TEXT)"
    )

    async def send(n: int) -> None:
        body = json.dumps(["p", f"r-{n % 4}", list(range(16))])
        await conn.execute(
            "INSERT INTO bench_peer_paths (sent, body) VALUES ($1, $2)", time.perf_counter(), body
        )

    async def read(last: int) -> list[tuple[int, float]]:
        found = await polled.fetch(
            "SELECT id, sent FROM bench_peer_paths WHERE id > $1 ORDER BY id", last
        )
        return [(int(r["id"]), float(r["sent"])) for r in found]

    try:
        return await _poll_while(count, every_s, poll_s, send, read)
    finally:
        await conn.execute("DROP TABLE IF EXISTS bench_peer_paths")
        await conn.close()
        await polled.close()


async def _poll_while(
    count: int,
    every_s: float,
    poll_s: float,
    send: Callable[[int], Any],
    read: Callable[[int], Any],
) -> tuple[Delays, int]:
    delays: Delays = []
    polls = 0
    last = 0
    done = asyncio.Event()

    async def poller() -> None:
        nonlocal polls, last
        while len(delays) < count:
            found = read(last)
            if asyncio.iscoroutine(found):
                found = await found
            polls += 1
            now = time.perf_counter()
            for row_id, sent in found:
                delays.append(now - sent)
                last = row_id
            if done.is_set() and not found:
                break
            await asyncio.sleep(poll_s)

    task = asyncio.create_task(poller())
    await paced(count, every_s, send)
    done.set()
    await asyncio.wait_for(task, 30)
    return delays, polls


@asynccontextmanager
async def relay() -> AsyncIterator[str]:
    """A node agent's place in the path: POSTs in, one NDJSON stream out."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def post(request: web.Request) -> web.Response:
        await queue.put(await request.read() + b"\n")
        return web.Response(status=204)

    async def feed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/x-ndjson"
        await response.prepare(request)
        while True:
            await response.write(await queue.get())

    app = web.Application()
    app.router.add_post("/in", post)
    app.router.add_get("/feed", feed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def agent_feed(count: int, every_s: float) -> Delays:
    delays: Delays = []
    async with (
        relay() as url,
        aiohttp.ClientSession() as session,
        session.get(f"{url}/feed") as stream,
    ):

        async def read() -> None:
            async for line in stream.content:
                delays.append(time.perf_counter() - json.loads(line)["sent"])
                if len(delays) >= count:
                    return

        reader = asyncio.create_task(read())

        async def send(n: int) -> None:
            body = {"sent": time.perf_counter(), "item": ["p", f"r-{n % 4}", list(range(16))]}
            async with session.post(f"{url}/in", json=body) as answer:
                await answer.read()

        await paced(count, every_s, send)
        await asyncio.wait_for(reader, 30)
    return delays


async def main(args: argparse.Namespace) -> None:
    every_s, poll_s = args.every_ms / 1000, args.poll_ms / 1000
    seconds = args.messages * every_s
    print(
        f"{args.messages} messages, one every {args.every_ms} ms; "
        f"stores polled every {args.poll_ms} ms"
    )
    print("| path | p50 ms | p99 ms | max ms | cost while idle |")
    print("|---|---|---|---|---|")
    delays = await peer_bus(args.messages, every_s)
    print(
        summary(
            "peer bus (ZeroMQ, gateway to gateway)", delays, "one heartbeat batch a second per peer"
        ),
        flush=True,
    )
    found, polls = await sqlite_store(args.messages, every_s, poll_s)
    print(
        summary("store, SQLite, polled", found, f"{polls / seconds:.0f} queries/s per gateway"),
        flush=True,
    )
    if args.database_url:
        found, polls = await postgres_store(args.database_url, args.messages, every_s, poll_s)
        print(
            summary(
                "store, PostgreSQL, polled", found, f"{polls / seconds:.0f} queries/s per gateway"
            ),
            flush=True,
        )
    delays = await agent_feed(args.messages, every_s)
    print(
        summary(
            "agent feed (POST, relay, NDJSON stream)", delays, "a stream per agent per gateway"
        ),
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--every-ms", type=float, default=5.0)
    parser.add_argument("--poll-ms", type=float, default=50.0)
    parser.add_argument("--database-url", default="")
    asyncio.run(main(parser.parse_args()))
