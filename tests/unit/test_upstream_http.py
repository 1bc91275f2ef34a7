"""The gateway's own client for engines on plain http (gateway/upstream_http.py), against raw
socket servers that answer as engines do and fail as engines fail: connections kept and reused
within the keep-alive only, each failure raised as the aiohttp type the callers tell apart
(gateway/upstream_post.closed_before_answering), the read timeout, and reading paused while a
slow client leaves a stream unread."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from gateway.upstream_http import READ_BUFFER_HIGH, UpstreamConnectError, UpstreamPool
from gateway.upstream_post import closed_before_answering, plain_http_address
from tests.ports import free_port

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer k"}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def plain(body: bytes, status: str = "200 OK") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


def chunked(*pieces: bytes) -> bytes:
    out = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for piece in pieces:
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
    return out + b"0\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def engine(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """A server on a free port; yields it and the list of connections it accepted (their
    sequence numbers, one per connection)."""
    port = free_port()
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted))
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", port)
    try:
        yield port, accepted
    finally:
        server.close()


async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request on the connection with its own body echoed in JSON."""
    while True:
        request = await read_request(reader)
        writer.write(plain(b'{"echo":' + request.split(b"\r\n\r\n", 1)[1] + b"}"))
        await writer.drain()


def pool(read_timeout_s: float = 10.0, keepalive_s: float = 4.0) -> UpstreamPool:
    return UpstreamPool(1.0, read_timeout_s, keepalive_s)


async def test_answers_are_read_whole_and_a_kept_connection_is_reused() -> None:
    client = pool()
    async with engine(answers) as (port, accepted):
        for n in range(3):
            answer = await client.post(
                "127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b'{"n":%d}' % n
            )
            assert answer.status == 200
            assert answer.headers["content-type"] == "application/json"
            assert await answer.read() == b'{"echo":{"n":%d}}' % n
            answer.close()  # after a whole answer: the connection stays in the pool
        assert accepted == [0], "one connection for the three"
    await client.close()


async def test_a_connection_idle_past_the_keep_alive_is_not_reused() -> None:
    client = pool(keepalive_s=0.1)
    async with engine(answers) as (port, accepted):
        await (
            await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"1")
        ).read()
        await asyncio.sleep(0.2)
        await (
            await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"2")
        ).read()
        assert accepted == [0, 1]
    await client.close()


async def test_a_stream_arrives_unchunked_and_ends_at_eof() -> None:
    events = [b"data: {}\n\n", b"data: [DONE]\n\n"]

    async def streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked(*events))
        await writer.drain()
        await reader.read()

    client = pool()
    async with engine(streams) as (port, _):
        answer = await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
        assert answer.headers["transfer-encoding"] == "chunked"
        got = b"".join([chunk async for chunk in answer.content.iter_any()])
        assert got == b"".join(events)
        assert answer.content.at_eof()
    await client.close()


async def test_a_body_that_ends_with_the_connection_is_read_whole() -> None:
    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 5000)
        await writer.drain()

    client = pool()
    async with engine(http10) as (port, _):
        answer = await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
        assert await answer.read() == b"x" * 5000
    await client.close()


async def test_an_engine_that_closes_before_answering_is_a_disconnect_sent_again() -> None:
    async def hangs_up(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    client = pool()
    async with engine(hangs_up) as (port, _):
        with pytest.raises(aiohttp.ServerDisconnectedError) as caught:
            await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
    assert closed_before_answering(caught.value)
    await client.close()


async def test_a_refused_connection_is_not_sent_again() -> None:
    client = pool()
    with pytest.raises(UpstreamConnectError) as caught:
        await client.post("127.0.0.1", free_port(), "127.0.0.1", "/v1/x", HEADERS, b"{}")
    assert caught.value.args[0] == errno.ECONNREFUSED
    assert isinstance(caught.value, aiohttp.ClientError)
    assert not closed_before_answering(caught.value)
    await client.close()


async def test_an_engine_silent_past_the_read_timeout_is_a_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    client = pool(read_timeout_s=0.2)
    async with engine(silent) as (port, accepted):
        with pytest.raises(TimeoutError):
            await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
        # The connection is not reused: what it was in the middle of is unknown.
        with pytest.raises(TimeoutError):
            await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
        assert accepted == [0, 1]
    await client.close()


@pytest.mark.parametrize("events", [3, 8])
async def test_the_read_timeout_runs_between_two_reads_not_over_the_whole_stream(
    events: int,
) -> None:
    """A stream that keeps sending is read whole, though it lasts longer in all than the read
    timeout (8 events); once it falls silent for the read timeout, it fails, not sooner, also
    where it fell silent before the read timeout of the wait for the answer's head passed (3)."""
    gap_s, timeout_s = 0.1, 0.35

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(events):  # a read every 0.1 s
            await asyncio.sleep(gap_s)
            writer.write(b"a\r\ndata: {}\n\n\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    client = pool(read_timeout_s=timeout_s)
    async with engine(stalls) as (port, _):
        answer = await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        last = [loop.time()]

        async def read_all() -> None:
            async for chunk in answer.content.iter_any():
                got.append(chunk)
                last[0] = loop.time()

        with pytest.raises(TimeoutError):
            await read_all()
        silent_s = loop.time() - last[0]
        assert b"".join(got) == b"data: {}\n\n" * events
        assert timeout_s * 0.9 <= silent_s < timeout_s + 0.5, silent_s
        answer.close()
    await client.close()


async def test_an_answer_cut_short_is_a_payload_error() -> None:
    async def cuts(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()

    client = pool()
    async with engine(cuts) as (port, _):
        answer = await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
        with pytest.raises(aiohttp.ClientPayloadError):
            await answer.read()
    await client.close()


async def test_reading_pauses_while_a_stream_is_left_unread_and_close_ends_it() -> None:
    wrote = 0
    closed = asyncio.Event()

    async def floods(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal wrote
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        piece = b"%x\r\n%s\r\n" % (16384, b"d" * 16384)
        try:
            for _ in range(1000):  # 16 MB, far more than any buffer on the way
                writer.write(piece)
                await writer.drain()
                wrote += 16384
        except ConnectionError:
            pass
        finally:
            closed.set()

    client = pool()
    async with engine(floods) as (port, _):
        answer = await client.post("127.0.0.1", port, f"127.0.0.1:{port}", "/v1/x", HEADERS, b"{}")
        await asyncio.sleep(0.5)  # nobody reads
        # What waits unread here is bounded: the engine's writes stop (the kernel's buffers
        # between hold the rest), not 16 MB in this process.
        assert answer._buffered <= READ_BUFFER_HIGH + 256 * 1024
        assert wrote < 16 * 1024 * 1024
        stream = answer.content.iter_any()
        assert len(await anext(stream)) > 0
        answer.close()  # the client left: the engine sees its connection end
        await asyncio.wait_for(closed.wait(), 5)
    await client.close()


def test_an_endpoints_address_path_prefix_and_host_header() -> None:
    assert plain_http_address("http://10.0.0.5:18000") == ("10.0.0.5", 18000, "10.0.0.5:18000", "")
    assert plain_http_address("10.0.0.5:18000/v1/") == ("10.0.0.5", 18000, "10.0.0.5:18000", "")
    assert plain_http_address("http://[::1]:8000/v1") == ("::1", 8000, "[::1]:8000", "")
    # An external endpoint behind a path: the requests' paths go under it, as aiohttp's did.
    assert plain_http_address("http://gw.example/openai/v1") == (
        "gw.example",
        80,
        "gw.example",
        "/openai",
    )
    assert plain_http_address("https://api.example/v1") is None  # aiohttp's session serves it


async def test_the_request_goes_out_with_the_given_path_host_and_headers_only() -> None:
    seen: list[bytes] = []

    async def notes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(plain(b"{}"))
        await writer.drain()

    client = pool()
    async with engine(notes) as (port, _):
        answer = await client.post("127.0.0.1", port, "gw.example", "/openai/v1/x", HEADERS, b"{}")
        assert await answer.read() == b"{}"
    await client.close()
    head = seen[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"POST /openai/v1/x HTTP/1.1"
    assert sorted(head[1:]) == sorted(
        [
            b"Host: gw.example",
            b"Content-Length: 2",
            b"Content-Type: application/json",
            b"Authorization: Bearer k",
        ]
    )
