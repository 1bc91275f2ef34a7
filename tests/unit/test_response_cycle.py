"""The gateway's request cycle (gateway/response_cycle.py) on a real uvicorn server with the
gateway's protocol: a plain answer leaves in one write, head and body together; a HEAD request
still gets its head; a stream's head is not held back for its first event, and goes with it
when it is sent at once; an answer started before the body was read still closes its
connection; a header value holding a line break is
never sent; a body of unknown length is chunked; a request body sent in pieces reaches the
application whole, in one message, and an application not yet reading holds reading back."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

from gateway.http_limits import HttpLimits, limited_protocol
from gateway.server import listen
from tests.gateway_kit import http_request


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/early":  # answers before reading the body
        body = b'{"error": "no"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"15")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/late-reader":  # asks for the body only after a while
        await asyncio.sleep(0.3)
        HELD_BEFORE_READING.append(receive.__self__.held_body_bytes)
    while True:
        message = await receive()
        RECEIVED.append((len(message.get("body", b"")), message.get("more_body", False)))
        if not message.get("more_body"):
            break
    if path == "/injected":  # a header value that would start a header of its own
        headers = [(b"x-request-id", b"a\r\nset-cookie: stolen=1"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})
        return
    if path == "/chunks":  # neither length nor stream header: chunked, as uvicorn frames it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"abc", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await send({"type": "http.response.body", "body": b"de", "more_body": False})
        return
    if path == "/stream-ready":  # the first event already in hand: sent with the head
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.sleep(0.3)
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.3)  # the first event is late: the head is not
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})
        return
    body = b'{"ok": true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"12")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


WRITES: list[bytes] = []  # what the server's transports were given to write, in order
RECEIVED: list[tuple[int, bool]] = []  # each `receive` of a body: its size and more_body
HELD_BEFORE_READING: list[int] = []  # /late-reader: body bytes read before it asked for any


class CountedWrites:
    """A connection's transport that keeps each write."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class CountingProtocol(limited_protocol(HttpLimits())):  # type: ignore[misc]
    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(CountedWrites(transport))


@asynccontextmanager
async def serving() -> AsyncIterator[int]:
    WRITES.clear()
    RECEIVED.clear()
    HELD_BEFORE_READING.clear()
    sock = listen("127.0.0.1", 0)
    config = uvicorn.Config(app, http=CountingProtocol, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def reads(port: int, request: bytes, expect: int) -> list[bytes]:
    """What each of the client's reads returned, until `expect` bytes or the connection ends."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(request)
        got: list[bytes] = []
        while sum(map(len, got)) < expect and (data := client.recv(65536)):
            got.append(data)
        return got


async def test_a_plain_answer_leaves_in_one_write() -> None:
    async with serving() as port:
        request = http_request("POST", "/plain", body=b"{}")
        got = await asyncio.to_thread(reads, port, request, 1)
    (write,) = WRITES
    assert write.startswith(b"HTTP/1.1 200 ")
    assert write.endswith(b'\r\n\r\n{"ok": true}'), write
    assert b"".join(got) == write


async def test_a_head_request_gets_its_head() -> None:
    async with serving() as port:
        got = await asyncio.to_thread(reads, port, http_request("HEAD", "/plain"), 1)
        answer = b"".join(got)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"content-length: 12" in answer
        assert answer.endswith(b"\r\n\r\n"), "no body to a HEAD request"


async def test_a_streams_head_is_not_held_for_its_first_event() -> None:
    async with serving() as port:
        request = http_request("POST", "/stream", body=b"{}")
        got = await asyncio.to_thread(reads, port, request, 1)
        assert got[0].startswith(b"HTTP/1.1 200 ")
        assert b"data: 1" not in got[0], "the head came alone, before the late event"
    assert WRITES[0].endswith(b"\r\n\r\n"), "the head in a write of its own"


async def test_a_streams_head_goes_with_an_event_sent_at_once() -> None:
    async with serving() as port:
        request = http_request("POST", "/stream-ready", headers={"Connection": "close"}, body=b"{}")
        got = await asyncio.to_thread(reads, port, request, 10**9)
    first, second = WRITES
    assert first.startswith(b"HTTP/1.1 200 ")
    assert first.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n"), first
    assert second == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
    assert b"".join(got) == first + second


async def test_an_answer_before_the_body_closes_the_connection() -> None:
    async with serving() as port:
        head = http_request("POST", "/early", headers={"Content-Length": "100000"})
        got = await asyncio.to_thread(reads, port, head, 10**9)
        answer = b"".join(got)
        assert answer.startswith(b"HTTP/1.1 401 "), answer
        assert b"connection: close" in answer, answer


async def test_a_header_value_with_a_line_break_is_never_sent() -> None:
    async with serving() as port:
        request = http_request("POST", "/injected", headers={"Connection": "close"}, body=b"{}")
        got = await asyncio.to_thread(reads, port, request, 10**9)
    answer = b"".join(got)
    assert b"set-cookie" not in answer.lower(), answer
    assert b"stolen" not in answer, answer


async def test_a_body_of_unknown_length_is_chunked() -> None:
    async with serving() as port:
        request = http_request("POST", "/chunks", headers={"Connection": "close"}, body=b"{}")
        expect = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        got = await asyncio.to_thread(reads, port, request, 10**9)
    answer = b"".join(got)
    assert b"transfer-encoding: chunked\r\n" in answer, answer
    assert answer.endswith(b"\r\n\r\n" + expect), answer


def send_in_pieces(port: int, request: bytes, piece: int, pause_s: float) -> bytes:
    """The answer to `request`, sent `piece` bytes at a time with a pause between."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(request), piece):
            client.sendall(request[start : start + piece])
            time.sleep(pause_s)
        client.shutdown(socket.SHUT_WR)
        got = []
        while data := client.recv(65536):
            got.append(data)
        return b"".join(got)


async def test_a_body_sent_in_pieces_reaches_the_application_whole_in_one_message() -> None:
    body = b"x" * 200_000
    request = http_request("POST", "/plain", headers={"Connection": "close"}, body=body)
    async with serving() as port:
        answer = await asyncio.to_thread(send_in_pieces, port, request, 20_000, 0.005)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    (received,) = RECEIVED  # one message: the whole body, no more to come
    assert received == (len(body), False)


async def test_an_application_not_yet_reading_holds_the_body_back() -> None:
    # Past uvicorn's high-water mark the server stops reading until the application asks:
    # a client's 4 MB is not all taken into memory while the request waits (one read of the
    # socket may go past the mark).
    body = b"y" * (4 * 1024 * 1024)
    request = http_request("POST", "/late-reader", headers={"Connection": "close"}, body=body)
    async with serving() as port:
        answer = await asyncio.to_thread(reads, port, request, 10**9)
    assert b"".join(answer).startswith(b"HTTP/1.1 200 ")
    (held,) = HELD_BEFORE_READING
    assert 0 < held <= HIGH_WATER_LIMIT + 512 * 1024, held
    (received,) = RECEIVED  # one message: the whole body, no more to come
    assert received == (len(body), False)
