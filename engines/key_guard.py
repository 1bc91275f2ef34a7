"""TensorRT-LLM's key guard: a small reverse proxy that answers only to the shard's engine key.

Every engine llmgw runs refuses requests without its key (the gateway, the agent's readiness
probe and its metrics scrape send `Authorization: Bearer <key>`), but `trtllm-serve` has no
API-key option at all (NVIDIA/TensorRT-LLM#9950, closed without one). So trtllm-serve listens on
loopback, on an inner port, and this guard holds the shard's address and port in front of it
(engines/trtllm.py). Standard library only: `python -I key_guard.py --listen HOST:PORT
--upstream 127.0.0.1:PORT`, the key in KEY_ENV (taken out at start), never on a command line.

Per connection: one request head (at most MAX_HEAD bytes, within HEAD_TIMEOUT_S); 401 with an
OpenAI-shaped error unless the key matches (constant-time; `GET /health` passes without one, as
vLLM leaves it, for liveness probes); else the request and its body go to the engine as framed,
and the response comes back as it arrives, unbuffered (SSE event by event). One request per
connection, both hops told `Connection: close`: the guard never has to find where a response
ends, and no pipelined request slips past the check. Engine unreachable or closing before it
answered: 502. Client gone (EOF) first: the engine's connection is closed, so it aborts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import sys

KEY_ENV = "LLMGW_GUARD_KEY"
MAX_HEAD = 64 * 1024  # a request or response head; a chunk-size line too
HEAD_TIMEOUT_S = 30.0  # for a client to send its whole request head
CLOSE_TIMEOUT_S = 5.0  # for a closing connection's last bytes to go out; then it is cut
LINGER_S = 1.0  # a refused client's unread bytes are read this long, so no RST eats the answer
COPY_BYTES = 64 * 1024
OPEN_PATHS = frozenset({"/health"})  # GET or HEAD without a key
# Hop-by-hop headers (RFC 9110 7.6.1) and those the guard handles itself: never relayed.
DROPPED = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "expect"}
    | {"authorization", "proxy-authorization"}
)
HEX = frozenset(b"0123456789abcdefABCDEF")
TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class BadRequest(ValueError):
    """A request the guard will not relay: it is answered 400."""


def error(status: int, reason: str, message: str, kind: str, code: str | None = None) -> bytes:
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}
    ).encode()
    extra = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode() + body


UNAUTHORIZED = error(401, "Unauthorized", "invalid engine key", "invalid_request_error", "401")
HEAD_TOO_LARGE = error(
    431, "Request Header Fields Too Large", "request head too large", "invalid_request_error"
)
UNREACHABLE = error(502, "Bad Gateway", "the engine is not reachable", "server_error", "502")
NO_ANSWER = error(502, "Bad Gateway", "the engine closed without an answer", "server_error", "502")


def bad_request(err: BadRequest) -> bytes:
    return error(400, "Bad Request", str(err), "invalid_request_error", "400")


def parse_request(raw: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    """(method, target, headers) of a request head ending in CRLF CRLF."""
    text = raw.decode("latin-1")[:-4]
    # No control character but tab, a bare CR or LF above all: an engine reading one as a line
    # end would see a request the guard never checked.
    if any((c < " " and c != "\t") or c == "\x7f" for c in text.replace("\r\n", "")):
        raise BadRequest("control character in the request head")
    start, *lines = text.split("\r\n")
    parts = start.split(" ")
    if len(parts) != 3 or not parts[1].startswith("/") or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest("malformed request line")
    if not parts[0] or not set(parts[0]) <= TCHAR:
        raise BadRequest("malformed request line")
    headers: list[tuple[str, str]] = []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= TCHAR:
            raise BadRequest("malformed header line")
        headers.append((name, value.strip(" \t")))
    return parts[0], parts[1], headers


def values(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [value for key, value in headers if key.lower() == name]


def body_framing(headers: list[tuple[str, str]]) -> tuple[int, bool]:
    """(Content-Length, chunked). Both, several, or an unknown coding: refused (smuggling)."""
    lengths, codings = values(headers, "content-length"), values(headers, "transfer-encoding")
    if codings:
        if lengths or len(codings) != 1 or codings[0].lower() != "chunked":
            raise BadRequest("unsupported Transfer-Encoding")
        return 0, True
    if len(lengths) > 1 or (lengths and not (lengths[0].isascii() and lengths[0].isdigit())):
        raise BadRequest("bad Content-Length")
    return (int(lengths[0]) if lengths else 0), False


def authorized(method: str, target: str, headers: list[tuple[str, str]], key: bytes) -> bool:
    if method in ("GET", "HEAD") and target.split("?", 1)[0] in OPEN_PATHS:
        return True
    given = values(headers, "authorization")
    if len(given) != 1:
        return False
    scheme, _, token = given[0].partition(" ")
    token_bytes = token.strip().encode("latin-1")
    return scheme.lower() == "bearer" and hmac.compare_digest(token_bytes, key)


def upstream_head(method: str, target: str, headers: list[tuple[str, str]]) -> bytes:
    named = {n.strip().lower() for v in values(headers, "connection") for n in v.split(",")}
    dropped = DROPPED | named  # and whatever the client's Connection names as hop-by-hop
    kept = [f"{k}: {v}" for k, v in headers if k.lower() not in dropped]
    return "\r\n".join([f"{method} {target} HTTP/1.1", *kept, "Connection: close", "", ""]).encode(
        "latin-1"
    )


def client_head(raw: bytes) -> bytes:
    """The engine's response head, saying `Connection: close` instead of what it said."""
    start, *lines = raw.split(b"\r\n")
    kept = [
        ln
        for ln in lines
        if ln and ln.split(b":")[0].strip().decode("latin-1").lower() not in DROPPED
    ]
    return b"\r\n".join([start, *kept, b"Connection: close", b"", b""])


async def copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while n > 0:
        data = await reader.read(min(n, COPY_BYTES))
        if not data:
            raise asyncio.IncompleteReadError(b"", n)
        writer.write(data)
        await writer.drain()
        n -= len(data)


async def copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        line = await reader.readuntil(b"\r\n")  # bounded by the reader's limit
        size = line[:-2].split(b";", 1)[0].strip()
        if not size or not set(size) <= HEX:
            raise BadRequest("bad chunk size")
        writer.write(size + b"\r\n")  # without extensions: only what was checked goes on
        if int(size, 16) == 0:
            while line != b"\r\n":  # trailers are dropped, up to the line that ends the body
                line = await reader.readuntil(b"\r\n")
            writer.write(b"\r\n")
            await writer.drain()
            return
        await copy_exact(reader, writer, int(size, 16) + 2)


async def relay_response(up: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await up.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        writer.write(NO_ANSWER)
        await writer.drain()
        return
    writer.write(client_head(head))
    await writer.drain()
    while data := await up.read(COPY_BYTES):  # whatever has arrived: SSE events as they come
        writer.write(data)
        await writer.drain()


async def until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(COPY_BYTES):
        pass  # anything after the request is dropped: one request per connection


async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bytes) -> None:
    """Answer, then read what the client still sends for a moment: closing with bytes unread
    would reset the connection, and the client could lose the answer."""
    writer.write(answer)
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(until_eof(reader), LINGER_S)


async def close(writer: asyncio.StreamWriter | None) -> None:
    """Close after what is buffered has gone out; cut it off if the peer will not take it."""
    if writer is None:
        return
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
    except (OSError, TimeoutError):
        writer.transport.abort()


async def serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    key: bytes,
    upstream: tuple[str, int],
) -> None:
    up_writer: asyncio.StreamWriter | None = None
    try:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            return await refuse(reader, writer, HEAD_TOO_LARGE)
        try:
            method, target, headers = parse_request(raw)
            length, chunked = body_framing(headers)
        except BadRequest as err:
            return await refuse(reader, writer, bad_request(err))
        if not authorized(method, target, headers, key):
            return await refuse(reader, writer, UNAUTHORIZED)
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream, limit=MAX_HEAD)
        except OSError:
            return await refuse(reader, writer, UNREACHABLE)
        up_writer.write(upstream_head(method, target, headers))
        if any(v.lower() == "100-continue" for v in values(headers, "expect")):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the key is good: send the body
            await writer.drain()
        try:
            body = (
                copy_chunked(reader, up_writer)
                if chunked
                else copy_exact(reader, up_writer, length)
            )
            await body
        except BadRequest as err:
            return await refuse(reader, writer, bad_request(err))
        except OSError:  # the engine went away while taking the body (a client gone is EOF)
            writer.write(NO_ANSWER)
            return
        relay = asyncio.create_task(relay_response(up_reader, writer))
        gone = asyncio.create_task(until_eof(reader))
        try:
            await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, gone):
                task.cancel()
            await asyncio.gather(relay, gone, return_exceptions=True)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
        pass  # either side went away or stalled: nothing left to answer
    finally:
        await close(up_writer)
        await close(writer)


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


async def run(listen: tuple[str, int], upstream: tuple[str, int], key: bytes) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve(reader, writer, key, upstream)

    server = await asyncio.start_server(handle, *listen, limit=MAX_HEAD, reuse_address=True)
    print(f"llmgw key guard: {listen[0]}:{listen[1]} -> {upstream[0]}:{upstream[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", required=True, type=host_port, help="HOST:PORT to serve")
    parser.add_argument("--upstream", required=True, type=host_port, help="the engine's HOST:PORT")
    args = parser.parse_args(argv)
    key = os.environ.pop(KEY_ENV, "")
    if not key:
        print(f"llmgw key guard: no key in {KEY_ENV}: refusing to start", flush=True)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args.listen, args.upstream, key.encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
