"""The gateway's listening socket (gateway/server.py `listen`): connections accepted on it send
each write at once (TCP_NODELAY) under the plain asyncio loop too, which `llmgw up` runs the
gateway in. asyncio sets the option only on sockets made for protocol IPPROTO_TCP, and a socket
made without naming it (protocol 0) did not get it: uvicorn writes a response's head and body
in two writes, so the body waited for the client's delayed acknowledgement of the head, about
40 ms a request on a keep-alive connection. (uvloop sets it on every TCP connection.)"""

from __future__ import annotations

import asyncio
import socket

from gateway.server import listen


async def _accepted_without_delay() -> int:
    sock = listen("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            raw = transport.get_extra_info("socket")
            accepted.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = await asyncio.get_running_loop().create_server(Accept, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(accepted, 5)
        finally:
            writer.close()
    finally:
        server.close()


def test_connections_accepted_under_the_plain_asyncio_loop_send_without_delay() -> None:
    assert asyncio.run(_accepted_without_delay()) != 0
