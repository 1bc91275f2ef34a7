"""Sockets for the hostile-client benchmark: connections from a chosen loopback address, one
request and its answer, pacing, and the gateway's side of a connection read from
/proc/net/tcp.

Raw non-blocking sockets rather than asyncio streams: a stream reads ahead into its own buffer,
and a client meant to read one byte a second must leave the bytes in the kernel, where they
push back on the gateway.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterable

from bench.gateway.loadgen import ResponseReader

HOST = "127.0.0.1"
# /proc/net/tcp's `st` column (include/net/tcp_states.h).
TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
}


_ERROR_CODE = re.compile(rb'"code"\s*:\s*"([^"]{1,60})"')


def answer_label(status: int, error_body: bytes) -> str:
    """`200`, or a refusal with the OpenAI error code its body names (`400 invalid_json`), so
    the report says why, not only that."""
    match = _ERROR_CODE.search(error_body) if status >= 300 else None
    return f"{status} {match.group(1).decode()}" if match else str(status)


class Failed(Exception):
    """A request that got no complete answer; the message is its label in the report."""


async def connect(port: int, source: str | None = None, rcvbuf: int | None = None) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if rcvbuf is not None:
            # Before connecting: the window offered in the handshake is sized from it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if source is not None:
            sock.bind((source, 0))
        await loop.sock_connect(sock, (HOST, port))
    except OSError as exc:
        sock.close()
        raise Failed(f"connect: {type(exc).__name__}") from exc
    return sock


async def exchange(sock: socket.socket, request: bytes) -> ResponseReader:
    """Send `request` and read its answer. The gateway may answer before it has read the body
    (401, 413) and close, so sending runs beside reading and stops when the answer is in."""
    loop = asyncio.get_running_loop()
    sending = asyncio.ensure_future(loop.sock_sendall(sock, request))
    reader = ResponseReader()
    try:
        while True:
            try:
                data = await loop.sock_recv(sock, 256 * 1024)
            except ConnectionResetError as exc:
                raise Failed("reset" if reader.status == 0 else f"{reader.status} reset") from exc
            if not data:
                if reader.finish_at_close():
                    return reader
                raise Failed("closed" if reader.status == 0 else f"{reader.status} cut")
            if reader.feed(data):
                return reader
    finally:
        if not sending.done():
            sending.cancel()
        elif not sending.cancelled():
            sending.exception()  # a send the answer overtook: its error is not the outcome


async def one_request(
    port: int, request: bytes, source: str | None = None, timeout_s: float = 30.0
) -> str:
    """A fresh connection, one request, closed: the answer's status, or how it failed."""
    try:
        async with asyncio.timeout(timeout_s):
            sock = await connect(port, source)
            try:
                reader = await exchange(sock, request)
                return answer_label(reader.status, reader.error_body)
            finally:
                sock.close()
    except Failed as exc:
        return str(exc)
    except TimeoutError:
        return "timeout"


class Pacer:
    """Slots at a steady rate, shared by every task that waits on it; a slot missed (the
    waiters were busy) is not made up later, so a stall does not become a burst."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate
        self._next = time.monotonic()

    async def wait(self) -> None:
        now = time.monotonic()
        slot = max(self._next, now)
        self._next = slot + self._interval
        await asyncio.sleep(slot - now)


async def paced(
    duration_s: float,
    rate: float,
    max_in_flight: int,
    send: Callable[[int], Awaitable[list[str]]],
    drain_s: float = 10.0,
) -> list[str]:
    """Call `send(i)` at `rate` a second for `duration_s`, at most `max_in_flight` at once;
    every label the calls return, and "unanswered at end" for those still out `drain_s`
    after."""
    pacer = Pacer(rate)
    gate = asyncio.Semaphore(max_in_flight)
    labels: list[str] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        try:
            labels.extend(await send(i))
        finally:
            gate.release()

    deadline = time.monotonic() + duration_s
    i = 0
    while time.monotonic() < deadline:
        await pacer.wait()
        await gate.acquire()
        if time.monotonic() >= deadline:
            gate.release()
            break
        task = asyncio.ensure_future(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=drain_s)
        for task in pending:
            task.cancel()
        labels += ["unanswered at end"] * len(pending)
    return labels


def _address(field: str) -> tuple[str, int]:
    # The address is the kernel's 32-bit word printed in hex, so in this machine's byte order.
    ip_hex, _, port_hex = field.partition(":")
    return socket.inet_ntoa(struct.pack("=I", int(ip_hex, 16))), int(port_hex, 16)


def server_side_states(
    proc_net_tcp: str, server_port: int, clients: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], str]:
    """The state of the server's end of each client connection, from /proc/net/tcp's text;
    "gone" where the server's end no longer exists (closed and done, or reset)."""
    wanted = set(clients)
    found: dict[tuple[str, int], str] = {}
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        local, remote = _address(fields[1]), _address(fields[2])
        if local[1] == server_port and remote in wanted:
            found[remote] = TCP_STATES.get(int(fields[3], 16), fields[3])
    return {client: found.get(client, "gone") for client in wanted}
