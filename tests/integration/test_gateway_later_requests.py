"""The head and body timeouts (gateway/http_limits.py) on a keep-alive connection's later
requests, not only its first: the timers are armed once the data at hand is parsed, from the
request's first byte and from the end of its head, and a request that arrives whole arms none.
The gateway runs in a subprocess of its own, before the llama-server stand-in's handlers."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.gateway_kit import (
    MODEL,
    GatewayProcess,
    complete_response,
    http_request,
    recording_standin,
    start_gateway_process,
)

CHAT = "/v1/chat/completions"
HEAD_TIMEOUT_S = 5.0  # HttpLimits' default
BODY_TIMEOUT_S = 3.0  # this gateway's


@pytest.fixture(scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayProcess]:
    state_dir = tmp_path_factory.mktemp("later-requests")
    async with recording_standin(state_dir) as upstream:
        proc = start_gateway_process(state_dir, upstream.url, body_timeout_s=BODY_TIMEOUT_S)
        try:
            yield proc
        finally:
            proc.stop()


def chat_request(gateway: GatewayProcess) -> bytes:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {**gateway.auth, "Content-Type": "application/json"}
    return http_request("POST", CHAT, headers=headers, body=body)


async def answered(reader: asyncio.StreamReader, count: int = 1) -> list[bytes]:
    """The next `count` responses on the connection, each by its Content-Length."""
    responses: list[bytes] = []
    data = b""
    while len(responses) < count:
        if complete_response(data):
            head, _, rest = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
            responses.append(head + b"\r\n\r\n" + rest[:length])
            data = rest[length:]
            continue
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, f"closed before answering: {data[:200]!r}"
        data += chunk
    assert data == b"", "nothing more was sent"
    return responses


@asynccontextmanager
async def after_one_answer(
    gateway: GatewayProcess,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A keep-alive connection whose first request has been answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(chat_request(gateway))
        (response,) = await answered(reader)
        assert response.startswith(b"HTTP/1.1 200 ")
        yield reader, writer
    finally:
        writer.close()


async def seconds_until_closed(reader: asyncio.StreamReader, limit_s: float) -> tuple[float, bytes]:
    started = time.perf_counter()
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), limit_s):
            data += chunk
    except ConnectionError:
        pass
    return time.perf_counter() - started, data


async def test_whole_requests_one_after_another_are_answered(gateway: GatewayProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        for _ in range(3):
            writer.write(chat_request(gateway))
            (response,) = await answered(reader)
            assert response.startswith(b"HTTP/1.1 200 ")
            await asyncio.sleep(0.2)
        # Two in one write (pipelined): both answered.
        writer.write(chat_request(gateway) * 2)
        assert all(r.startswith(b"HTTP/1.1 200 ") for r in await answered(reader, 2))
    finally:
        writer.close()


async def test_a_later_request_trickling_its_head_is_cut_off(gateway: GatewayProcess) -> None:
    async with after_one_answer(gateway) as (reader, writer):
        request = chat_request(gateway)

        async def trickle() -> None:
            for byte in request[:80]:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.5)

        feeder = asyncio.create_task(trickle())
        try:
            held, _ = await seconds_until_closed(reader, 20)
        finally:
            feeder.cancel()
    assert HEAD_TIMEOUT_S - 0.5 < held < HEAD_TIMEOUT_S + 2.5, held


async def test_a_later_request_whose_body_stops_is_cut_off(gateway: GatewayProcess) -> None:
    async with after_one_answer(gateway) as (reader, writer):
        headers = {**gateway.auth, "Content-Type": "application/json", "Content-Length": "1000"}
        writer.write(http_request("POST", CHAT, headers=headers) + b'{"model": "smol"')
        held, data = await seconds_until_closed(reader, 20)
    assert BODY_TIMEOUT_S - 0.5 < held < BODY_TIMEOUT_S + 2.5, held
    assert data == b"" or data.startswith(b"HTTP/1.1 408 "), data[:200]
