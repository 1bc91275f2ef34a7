"""Running the gateway in the current event loop, for `llmgw gateway` and `llmgw up`."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import resource
import socket

import uvicorn

from gateway.allocator import tune_allocator
from gateway.app import create_app
from gateway.console.source import ClusterConsole
from gateway.http_limits import HttpLimits, limited_protocol
from gateway.route_source import RouteSource
from gateway.settings import GatewaySettings
from store import Store

# Between two requests on one connection; the head timeout (gateway/http_limits.py) takes over
# from the first byte of the next request. Longer than clients keep an idle connection (httpx and
# the `openai` client 5 s, aiohttp 15 s, nginx's upstream keep-alive and cloud load balancers
# 60 s), so that the client, not the gateway, closes it: at uvicorn's 5 s an httpx client now and
# then sent its request onto a connection the gateway was closing, and lost it ("Server
# disconnected"; the `openai` client retries that, a client with retries off does not).
KEEP_ALIVE_S = 65
# The soft limit on open files asked for when the hard limit is unlimited: Linux refuses more
# than its nr_open, 1,048,576 by default.
OPEN_FILES_WHEN_UNLIMITED = 1 << 20
# How long a cancelled gateway waits for its own shutdown (flushing usage, giving back leases).
CANCELLED_SHUTDOWN_S = 10

# Container objects allocated (less those freed) between two collections of the youngest
# generation; Python's default is 700. Requests in flight hold objects across awaits, so at 64
# concurrent requests more than 700 stay alive at any moment and the default ran a collection
# every few requests, promoting them to the older generations and so into full collections:
# 13% of the gateway's CPU at 64 connections (docs/benchmarks.md, Gateway). The gateway's
# requests leave no reference cycles (tests/unit/test_gateway_garbage.py), so collecting
# rarely holds back little memory.
YOUNG_COLLECTION_THRESHOLD = 10_000

log = logging.getLogger(__name__)


def http_limits(settings: GatewaySettings) -> HttpLimits:
    return HttpLimits(max_body_bytes=settings.max_body_bytes)


def uvicorn_config(
    settings: GatewaySettings,
    store: Store,
    route_source: RouteSource,
    admin_address: tuple[str, int] | None = None,
    cluster: ClusterConsole | None = None,
) -> uvicorn.Config:
    """Without `admin_address` the admin API shares the one listener (tests); `serve` gives it
    a loopback listener of its own."""
    return uvicorn.Config(
        create_app(settings, store, route_source, admin_address, cluster),
        host=settings.host,
        port=settings.port,
        # httptools (llhttp) under the bounds uvicorn leaves out; measured faster than h11, and
        # strict where smuggling is concerned.
        http=limited_protocol(http_limits(settings)),
        # Used when uvicorn makes the loop (Server.run, Config.get_loop_factory); `serve` below
        # runs in the caller's loop, which the caller chooses.
        loop="uvloop",
        timeout_keep_alive=KEEP_ALIVE_S,
        log_level="warning",
        access_log=False,
        # The admin API trusts the socket's peer address: never let a header rewrite it.
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        ws="none",
    )


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, as Go's runtime does,
    and return the soft limit now in force. Each client
    connection and each engine connection is a file; the common soft limit of 1024 would cap a
    gateway near a thousand open streams, and idle clients are kept 65 s (KEEP_ALIVE_S)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WHEN_UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as err:
            log.warning(
                "open files stay limited to %d (raising it to %d failed: %s)", soft, wanted, err
            )
            return soft
        return wanted
    return soft


def tune_collector() -> None:
    """Set the cycle collector for a serving process: what start-up made (modules, classes, the
    app) is moved out of its reach for good (`gc.freeze`, so a full collection no longer walks
    it), and the youngest generation is collected only after YOUNG_COLLECTION_THRESHOLD
    allocations. The older generations keep Python's defaults."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)


def tune_process() -> None:
    """What a serving process sets for itself: the cycle collector and the C allocator
    (gateway/allocator.py)."""
    tune_collector()
    tune_allocator()


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A bound listening socket. `reuse_port`: several processes bind the same port and the
    kernel spreads new connections among them (SO_REUSEPORT, `llmgw gateway --workers`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Named IPPROTO_TCP, not left 0: asyncio's loop (which `llmgw up` runs the gateway in) sets
    # TCP_NODELAY only on connections of such a socket, and without it a response's body
    # waited for the client's delayed acknowledgement of its head: about 40 ms a request on a
    # keep-alive connection (tests/unit/test_gateway_listen.py). uvloop sets it regardless.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise RuntimeError(f"the gateway cannot listen on {host}:{port}: {err.strerror}") from None
    sock.set_inheritable(True)
    return sock


async def serve(
    settings: GatewaySettings,
    store: Store,
    route_source: RouteSource,
    cluster: ClusterConsole | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve the OpenAI API on settings.host:port and the admin API on its own loopback
    listener, until the process is told to stop (SIGINT/SIGTERM, handled by uvicorn). The
    store stays the caller's to close. `reuse_port`: the public port is shared with the other
    worker processes of one gateway."""
    if not ipaddress.ip_address(settings.admin_host).is_loopback:
        raise RuntimeError(f"the admin API listens on loopback only, not {settings.admin_host}")
    raise_open_files_limit()
    tune_process()
    public = listen(settings.host, settings.port, reuse_port)
    admin = listen(settings.admin_host, settings.admin_port)
    admin_address = admin.getsockname()[:2]
    server = uvicorn.Server(uvicorn_config(settings, store, route_source, admin_address, cluster))
    try:
        await server.serve(sockets=[public, admin])
    except SystemExit as exc:
        # uvicorn exits the process when start-up fails (store unreachable, port taken); in
        # `llmgw up` other components share this loop, so fail as an ordinary error instead.
        raise RuntimeError("the gateway failed to start (the reason is logged above)") from exc
    except asyncio.CancelledError:
        # Cancelled by the program running it (a test, a loop it is embedded in), uvicorn skips
        # its own shutdown: the app's lifespan would be left pending, so usage counted since the
        # last flush would never be written and the shared limits' leases never given back.
        if server.started:
            await asyncio.wait_for(server.lifespan.shutdown(), CANCELLED_SHUTDOWN_S)
        raise
    finally:
        # A cancelled serve leaves uvicorn's listeners registered with the event loop: close
        # them before their sockets, or a reused file descriptor meets a stale registration.
        for listener in getattr(server, "servers", []):
            listener.close()
        public.close()
        admin.close()
