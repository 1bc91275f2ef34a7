"""Two gateway processes on one store route as one: a prefix sent through one is followed
through the other, and through the other again after it restarts (gateway/peers/). Real
gateway subprocesses (uvloop, as `llmgw gateway` runs), a real SQLite store, three llama-server
stand-ins that record what reached them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from tests.gateway_kit import GatewayProcess, Upstream, recording_standin, start_gateway_process

SYSTEMS = [
    f"You are assistant number {n} of the {topic} desk. Answer in full sentences. " * 12
    for n, topic in enumerate(("bicycle", "clinical trials", "tax law"))
]


@pytest.fixture
async def upstreams(tmp_path: Path) -> AsyncIterator[list[Upstream]]:
    async with AsyncExitStack() as stack:
        found = []
        for n in range(3):
            (tmp_path / f"u{n}").mkdir()
            found.append(await stack.enter_async_context(recording_standin(tmp_path / f"u{n}")))
        yield found


async def ask(gateway: GatewayProcess, system: str, question: str) -> None:
    async with httpx.AsyncClient(timeout=15, trust_env=False) as client:
        answer = await client.post(
            f"{gateway.url}/v1/chat/completions",
            headers=gateway.auth,
            json={
                "model": "smol",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
                "max_tokens": 4,
            },
        )
    assert answer.status_code == 200, answer.text


def served_by(upstreams: list[Upstream], question: str) -> int:
    marker = question.encode()
    found = [n for n, u in enumerate(upstreams) for _, _, body in u.seen if marker in body]
    assert len(found) == 1, found
    return found[0]


async def peers_heard(gateway: GatewayProcess, count: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        while True:
            peers = (await client.get(f"{gateway.url}/healthz")).json()["peers"]
            if len(peers) == count and all(peers.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"peers of {gateway.url}: {peers}")
            await asyncio.sleep(0.1)


async def test_a_prefix_is_followed_through_another_gateway_and_after_it_restarts(
    tmp_path: Path, upstreams: list[Upstream]
) -> None:
    urls = [u.url for u in upstreams]
    a = start_gateway_process(tmp_path, *urls)
    b = start_gateway_process(tmp_path, *urls)
    try:
        await peers_heard(a, 1)
        await peers_heard(b, 1)
        placed = []
        for n, system in enumerate(SYSTEMS):
            await ask(a, system, f"first question {n}")
            placed.append(served_by(upstreams, f"first question {n}"))
        # New prefixes go where the least was sent: one to each replica.
        assert sorted(placed) == [0, 1, 2]
        await asyncio.sleep(0.2)  # a tells b within a flush (10 ms)
        # In another order than a's: by its own record b would place them as new prefixes,
        # in turn from the first replica, each somewhere else.
        for n in (2, 0, 1):
            await ask(b, SYSTEMS[n], f"second question {n}")
            assert served_by(upstreams, f"second question {n}") == placed[n]
        # b restarts: a new process with an empty record, which takes a's before it serves.
        b.stop()
        b = start_gateway_process(tmp_path, *urls)
        for n in (1, 2, 0):
            await ask(b, SYSTEMS[n], f"third question {n}")
            assert served_by(upstreams, f"third question {n}") == placed[n]
    finally:
        b.stop()
        a.stop()
