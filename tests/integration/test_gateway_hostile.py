"""The gateway against hostile clients, through real sockets: the gateway runs in a subprocess
of its own (its memory and event loop are what is measured), upstream is the llama-server
stand-in's handlers recording every request that reaches them, and requests that an HTTP
client would tidy up are written byte for byte."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import re
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from activities.agent import procfs
from store import Store, open_store
from tests.gateway_kit import (
    MODEL,
    GatewayProcess,
    RawReply,
    Upstream,
    complete_response,
    http_request,
    raw_exchange,
    recording_standin,
    start_gateway_process,
)

MIB = 1024 * 1024
CHAT = "/v1/chat/completions"
# Client addresses: all of 127/8 reaches loopback, so each test (and each try of the timing
# test) can be a different client to a per-address lockout.
_fresh_clients = (str(ipaddress.IPv4Address("127.1.0.0") + i) for i in itertools.count(1))


def fresh_client() -> str:
    return next(_fresh_clients)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
async def upstream(state_dir: Path) -> AsyncIterator[Upstream]:
    async with recording_standin(state_dir) as up:
        yield up


@pytest.fixture(scope="module")
def gateway(state_dir: Path, upstream: Upstream) -> Iterator[GatewayProcess]:
    proc = start_gateway_process(state_dir, upstream.url)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
async def store(
    state_dir: Path,
    gateway: GatewayProcess,  # noqa: ARG001 - requested so the gateway starts first
) -> AsyncIterator[Store]:
    """The gateway's own store, opened from here too: keys to add, tables to inspect."""
    store = open_store(None, state_dir)
    await store.init()
    yield store
    await store.close()


def chat_body(model: str = MODEL, content: str = "hello there") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}]}).encode()


def chat(headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    headers = {"Content-Type": "application/json", **(headers or {})}
    return http_request("POST", CHAT, headers=headers, body=body or chat_body())


def assert_error_shape(reply: RawReply, status: int, code: str | None = None) -> dict[str, Any]:
    assert reply.status == status, reply.data[:500]
    error: dict[str, Any] = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


async def settle(upstream: Upstream, before: int) -> list[tuple[str, str, bytes]]:
    """The requests forwarded upstream since `before` (the gateway's own metrics scrapes
    left out), after giving a stray forward time to land."""
    await asyncio.sleep(0.5)
    return [seen for seen in upstream.seen[before:] if seen[0] == "POST"]


async def wait_for_key(gw: GatewayProcess, key: str) -> None:
    """Until the gateway's key refresh has the key in its state (usable or revoked)."""
    async with httpx.AsyncClient(base_url=gw.url, trust_env=False) as client:
        for _ in range(100):
            reply = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            if reply.status_code == 200:
                return
            await asyncio.sleep(0.05)


# --- authentication failures ------------------------------------------------------------------


async def test_every_kind_of_bad_key_gets_the_same_401_in_similar_time(
    gateway: GatewayProcess, store: Store
) -> None:
    """Which way a key is wrong must not show, in the answer or in its timing: a slower path
    for unknown key_ids (a store lookup) or for real ones (a hash compare) tells a prober which
    key_ids exist. Medians over 50 tries each, interleaved so load on this machine hits every
    kind alike; a 3x bound on medians is loose enough for a 2-core CI box yet catches a path
    that does real extra work (a database round trip costs more than the whole in-memory
    check)."""
    revoked_record, revoked = await store.create_key(f"revoked-{uuid.uuid4().hex[:6]}")
    await wait_for_key(gateway, revoked)
    await store.revoke_key(revoked_record.key_id)
    key_id = gateway.key_id
    secret = gateway.api_key.rsplit("-", 1)[1]
    wrong_secret = f"llmgw-{key_id}-{'A' * len(secret)}"
    kinds: dict[str, Any] = {
        "none": lambda: {},
        "empty": lambda: {"Authorization": "Bearer "},
        "malformed": lambda: {"Authorization": "Bearer not-a-key"},
        "wrong_secret": lambda: {"Authorization": f"Bearer {wrong_secret}"},
        # A fresh, well-formed key_id each time, as a prober would send.
        "unknown_key_id": lambda: {
            "Authorization": f"Bearer llmgw-{uuid.uuid4().hex[:8]}-{'B' * len(secret)}"
        },
        "revoked": lambda: {"Authorization": f"Bearer {revoked}"},
    }
    # The revocation reaches the gateway within its key refresh interval.
    for _ in range(100):
        reply = await raw_exchange(gateway.url, chat(kinds["revoked"]()),
                                   local_host=fresh_client())  # fmt: skip
        if reply.status == 401:
            break
        await asyncio.sleep(0.05)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    shapes: dict[str, set[tuple[Any, ...]]] = {kind: set() for kind in kinds}
    for _ in range(50):
        for kind, headers in kinds.items():
            reply = await raw_exchange(gateway.url, chat(headers()),
                                       local_host=fresh_client())  # fmt: skip
            error = assert_error_shape(reply, 401)
            shapes[kind].add((reply.status, error["type"], error["code"], error["param"]))
            times[kind].append(reply.seconds)
    assert len(set().union(*shapes.values())) == 1, shapes
    medians = {kind: statistics.median(t) for kind, t in times.items()}
    assert max(medians.values()) <= 3 * min(medians.values()), medians


async def test_a_401_sent_before_the_body_arrived_closes_the_connection_and_says_so(
    gateway: GatewayProcess,
) -> None:
    """A keep-alive client whose body follows its head a moment later (httpx writes them
    apart) gets its 401 before the body is read. The connection is closed after the answer,
    so the answer must say `connection: close`: without it the client sent its next request
    on the closing connection and lost it ("Server disconnected without sending a
    response")."""
    body = chat_body()
    head = http_request("POST", CHAT, headers={
        "Authorization": "Bearer llmgw-00000000-wrong", "Content-Type": "application/json",
        "Content-Length": str(len(body)),
    })  # fmt: skip
    host, _, port = gateway.url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(fresh_client(), 0))
    try:
        writer.write(head)
        await writer.drain()
        answer = b""
        while not complete_response(answer):
            piece = await asyncio.wait_for(reader.read(65536), 10)
            assert piece, answer
            answer += piece
        reply = RawReply(answer, False, 0.0)
        assert_error_shape(reply, 401, "invalid_api_key")
        assert re.search(rb"(?im)^connection:\s*close\s*$", answer.partition(b"\r\n\r\n")[0])
        # The body still arrives; it is read and discarded, and then the connection ends.
        writer.write(body)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(65536), 10) == b""
    finally:
        writer.close()

    # What the user saw: a keep-alive client's requests after a refused one all get answers.
    # Fewer refusals than a lockout takes.
    transport = httpx.AsyncHTTPTransport(local_address=fresh_client())
    async with httpx.AsyncClient(
        base_url=gateway.url, transport=transport, trust_env=False, timeout=10
    ) as client:
        for _ in range(5):
            refused = await client.post(CHAT, content=body, headers={
                "Authorization": "Bearer llmgw-00000000-wrong",
                "Content-Type": "application/json",
            })  # fmt: skip
            assert refused.status_code == 401
            served = await client.post(CHAT, content=body, headers=gateway.auth)
            assert served.status_code == 200, served.text[:300]


async def test_a_client_that_keeps_failing_is_locked_out_and_no_one_else_is(
    gateway: GatewayProcess,
) -> None:
    attacker, bystander = fresh_client(), fresh_client()
    bad = chat({"Authorization": f"Bearer llmgw-{'0' * 8}-{'C' * 43}"})
    locked: RawReply | None = None
    for _ in range(50):
        reply = await raw_exchange(gateway.url, bad, local_host=attacker)
        assert reply.status in (401, 429), reply.data[:300]
        if reply.status == 429:
            locked = reply
            break
    assert locked is not None, "50 failed attempts in a row and still no 429"
    assert_error_shape(locked, 429)
    retry_after = [
        line.split(b":", 1)[1].strip()
        for line in locked.data.partition(b"\r\n\r\n")[0].split(b"\r\n")
        if line.lower().startswith(b"retry-after:")
    ]
    assert retry_after, locked.data
    assert retry_after[0].isdigit(), locked.data
    assert int(retry_after[0]) > 0, locked.data
    # Another client, right now: served with its good key, and a plain 401 for a bad one.
    good = await raw_exchange(gateway.url, chat(gateway.auth), local_host=bystander)
    assert good.status == 200, good.data[:300]
    assert (await raw_exchange(gateway.url, bad, local_host=bystander)).status == 401


# --- paths --------------------------------------------------------------------------------

PATH_TRICKS = [
    "//v1/chat/completions",
    "/v1/%2E%2E/admin/v1/routes",
    "/v1/../admin/v1/routes",
    "/v1/./../admin/v1/routes",
    "/admin%2Fv1/routes",
    "/admin%2fv1%2froutes",
    "/%61dmin/v1/routes",
    "/admin/v1/routes/",
    "/admin/v1/routes;x",
    "/admin/v1/routes?x=/v1/models",
    "/V1/models",
    "/v1/models/../../admin/v1/routes",
    "/v1//models",
    "/v1/models%00",
    "/v1/chat/completions%0d%0aX-Injected:%201",
]


@pytest.mark.parametrize("path", PATH_TRICKS)
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_path_tricks_from_a_name_never_reach_the_admin_api(
    gateway: GatewayProcess, path: str, method: str
) -> None:
    """A DNS-rebinding page comes from loopback with its own name as Host."""
    request = http_request(method, path, host="attacker.example", headers=gateway.auth,
                           body=chat_body() if method == "POST" else b"")  # fmt: skip
    reply = await raw_exchange(gateway.url, request, local_host=fresh_client())
    assert_refused_clearly(reply)


@pytest.mark.parametrize("path", PATH_TRICKS)
async def test_path_tricks_from_another_machine_never_reach_the_admin_api(
    gateway: GatewayProcess, path: str
) -> None:
    if gateway.outside_url is None:
        pytest.skip("this machine has no non-loopback address to connect from")
    host = gateway.outside_url.removeprefix("http://").rpartition(":")[0]
    for host_header in (host, "127.0.0.1"):
        request = http_request("GET", path, host=host_header, headers=gateway.auth)
        reply = await raw_exchange(gateway.outside_url, request, local_host=host)
        assert_refused_clearly(reply)


def assert_refused_clearly(reply: RawReply) -> None:
    assert reply.status in (400, 401, 403, 404, 405), reply.data[:500]
    if reply.status != 400:  # llhttp's own refusals are answered outside the application
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if reply.status == 403:
            assert error["code"] == "admin_local_only", error
    assert b'"routes"' not in reply.body
    assert b"replica_id" not in reply.body


# --- sizes --------------------------------------------------------------------------------


async def test_a_100_mib_body_is_refused_at_once_without_being_held(
    gateway: GatewayProcess,
) -> None:
    """Declared or not, the gateway answers 413 long before 100 MiB could be read, and its
    memory does not grow by anything like the body (a chunked body is read up to the limit
    by design; the bound leaves room for that and for the allocator)."""
    for declared in (True, False):
        before = gateway.rss_bytes()
        reply, seconds = await send_big_body(gateway, 100 * MIB, declared)
        grown = gateway.rss_bytes() - before
        assert reply.startswith(b"HTTP/1.1 413 "), (declared, reply[:300])
        assert b"request_too_large" in reply
        assert seconds < 5, (declared, seconds)
        assert grown < 48 * MIB, (declared, grown / MIB)
    # And the gateway is still itself.
    ok = await raw_exchange(gateway.url, chat(gateway.auth), local_host=fresh_client())
    assert ok.status == 200, ok.data[:300]


async def send_big_body(gw: GatewayProcess, size: int, declared: bool) -> tuple[bytes, float]:
    host, _, port = gw.url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    headers = {**gw.auth, "Content-Type": "application/json"}
    headers |= {"Content-Length": str(size)} if declared else {"Transfer-Encoding": "chunked"}
    writer.write(http_request("POST", CHAT, headers=headers))
    started = time.perf_counter()
    answer = asyncio.create_task(reader.read(65536))
    piece = b'{"model": "smol", "messages": "' + b"x" * (MIB - 40)
    sent = 0
    try:
        while sent < size and not answer.done():
            chunk = piece[: size - sent]
            writer.write(chunk if declared else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            try:
                await asyncio.wait_for(writer.drain(), 5)
            except (ConnectionError, TimeoutError):
                break
        reply = await asyncio.wait_for(answer, 10)
        while not complete_response(reply):
            more = await asyncio.wait_for(reader.read(65536), 5)
            if not more:
                break
            reply += more
    finally:
        writer.close()
    return reply, time.perf_counter() - started


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for stat in procfs.live_processes():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """Not ended (a zombie waiting for whoever adopted it to reap it has ended)."""
    stat = procfs.read_stat(pid)
    return stat is not None and stat.running


async def test_a_killed_gateway_leaves_no_body_parsing_process_behind(
    state_dir: Path, upstream: Upstream
) -> None:
    """A large body starts the gateway's parsing pool (a forkserver and its workers). Killed
    without a shutdown (SIGKILL, the OOM killer), the gateway took neither with it: the worker
    kept the forkserver up, and both ran on for good."""
    gw = start_gateway_process(state_dir, upstream.url)
    try:
        # Over the 64 KiB parsed inline and of many small values (20,000 short messages), which
        # a worker parses (gateway/body_parse.py; one long string would be parsed inline).
        messages = [{"role": "user", "content": "hi"}] * 20_000
        big = json.dumps({"model": MODEL, "messages": messages}).encode()
        reply = await raw_exchange(gw.url, chat(gw.auth, big), local_host=fresh_client())
        assert reply.status == 200, reply.data[:300]
        pool = descendants(gw.proc.pid)
        assert pool, "no parsing process started"
        gw.proc.kill()
        gw.proc.wait(10)
        deadline = time.monotonic() + 10
        while left := {pid for pid in pool if running(pid)}:
            assert time.monotonic() < deadline, f"still running after the gateway: {left}"
            await asyncio.sleep(0.1)
    finally:
        gw.stop()


async def test_deeply_nested_json_is_a_400(gateway: GatewayProcess) -> None:
    depth = 100_000
    body = b'{"model": "smol", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    for path in (CHAT, "/v1/completions", "/v1/embeddings"):
        headers = {**gateway.auth, "Content-Type": "application/json"}
        request = http_request("POST", path, headers=headers, body=body)
        reply = await raw_exchange(gateway.url, request, local_host=fresh_client())
        assert_error_shape(reply, 400)
    ok = await raw_exchange(gateway.url, chat(gateway.auth), local_host=fresh_client())
    assert ok.status == 200, "the gateway did not survive"


HUGE_HEADERS = {
    "one_1mib_header": {"X-Big": "a" * MIB},
    "ten_thousand_headers": {f"X-H{i}": "v" for i in range(10_000)},
    "a_64kib_cookie": {"Cookie": "c=" + "x" * 64 * 1024},
}


@pytest.mark.parametrize("name", list(HUGE_HEADERS))
async def test_huge_headers_are_431_or_a_closed_connection(
    gateway: GatewayProcess, name: str
) -> None:
    before = gateway.rss_bytes()
    request = chat({**gateway.auth, **HUGE_HEADERS[name]})
    reply = await raw_exchange(gateway.url, request, local_host=fresh_client(), timeout=10)
    assert reply.status == 431 or (reply.status is None and reply.closed), reply.data[:300]
    assert reply.seconds < 5
    assert gateway.rss_bytes() - before < 16 * MIB


async def test_a_huge_request_line_is_refused(gateway: GatewayProcess) -> None:
    request = http_request("GET", "/v1/models?" + "q" * MIB, headers=gateway.auth)
    reply = await raw_exchange(gateway.url, request, local_host=fresh_client())
    assert reply.status in (414, 431) or (reply.status is None and reply.closed), reply.data[:300]


# --- request smuggling --------------------------------------------------------------------


SMUGGLING = {
    "cl_and_te": lambda auth: (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + b"0\r\n\r\n" + smuggled_with(auth)
    ),
    "te_and_cl": lambda auth: (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: 6\r\n\r\n" + b"0\r\n\r\n" + smuggled_with(auth)
    ),
    "te_with_a_bad_chunk": lambda auth: (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (len(chat_body()), chat_body())  # a whole JSON body, then:
        + b"zz\r\n" + smuggled_with(auth) + b"\r\n0\r\n\r\n"
    ),
    "te_obfuscated": lambda auth: (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding : chunked\r\n\r\n" + b"0\r\n\r\n" + smuggled_with(auth)
    ),
    # HTTP/1.0 has no transfer codings: served, the connection was then closed and the
    # request pipelined behind it lost without an answer.
    "http10_chunked": lambda auth: (
        b"POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(chat_body()), chat_body()) + smuggled_with(auth)
    ),
    "two_content_lengths": lambda auth: (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\n"
        + b"Content-Length: %d\r\nContent-Length: 0\r\n\r\n" % len(chat_body())
        + chat_body() + smuggled_with(auth)
    ),
    "two_equal_content_lengths": lambda auth: (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\n"
        + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % ((len(chat_body()),) * 2)
        + chat_body()
    ),
}  # fmt: skip


def smuggled_with(auth: bytes) -> bytes:
    body = chat_body(content="smuggled")
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )  # fmt: skip


@pytest.mark.parametrize("name", list(SMUGGLING))
async def test_ambiguous_framing_is_refused_and_nothing_reaches_upstream(
    gateway: GatewayProcess, upstream: Upstream, name: str
) -> None:
    auth = f"Authorization: Bearer {gateway.api_key}\r\n".encode()
    before = len(upstream.seen)
    reply = await raw_exchange(gateway.url, SMUGGLING[name](auth), local_host=fresh_client(),
                               read_until_close=True, timeout=5)  # fmt: skip
    assert reply.status == 400 or (reply.status is None and reply.closed), reply.data[:500]
    assert reply.data.count(b"HTTP/1.1 ") <= 1, "a second response: something was smuggled"
    assert reply.closed, "the connection stayed open after an ambiguous request"
    assert await settle(upstream, before) == []


# --- slowloris ----------------------------------------------------------------------------


async def test_slowloris_connections_are_cut_off_and_others_keep_their_latency(
    gateway: GatewayProcess,
) -> None:
    """50 connections each trickling a header byte a second: each is closed within the head
    timeout (5 s, gateway/http_limits.py) plus scheduling slack, and meanwhile an ordinary
    client's median latency stays within 2x of what it was before (plus 2 ms, the noise floor
    of one loopback round trip on a loaded machine)."""
    host, _, port = gateway.url.removeprefix("http://").rpartition(":")

    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False) as client:

        async def latencies(count: int) -> list[float]:
            seconds = []
            for _ in range(count):
                started = time.perf_counter()
                reply = await client.post(CHAT, content=chat_body(), headers=gateway.auth)
                seconds.append(time.perf_counter() - started)
                assert reply.status_code == 200, reply.text
                await asyncio.sleep(0.05)
            return seconds

        baseline = statistics.median(await latencies(30))

        async def trickle() -> float:
            reader, writer = await asyncio.open_connection(host, int(port))
            started = time.perf_counter()
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 60

            async def feed() -> None:
                for byte in head:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(1)

            feeder = asyncio.create_task(feed())
            try:
                while await asyncio.wait_for(reader.read(1024), 15):
                    pass
                return time.perf_counter() - started
            except (ConnectionError, TimeoutError):
                return time.perf_counter() - started
            finally:
                feeder.cancel()
                writer.close()

        tricklers = [asyncio.create_task(trickle()) for _ in range(50)]
        await asyncio.sleep(0.5)
        during = statistics.median(await latencies(30))
        held = await asyncio.gather(*tricklers)
    assert max(held) < 5 + 2.5, sorted(held)[-5:]
    assert during <= 2 * baseline + 0.002, (baseline, during)


async def test_a_body_that_never_finishes_is_cut_off(state_dir: Path, upstream: Upstream) -> None:
    """Slow POST: the head in time, then a body that stops. Cut off at the body timeout (3 s
    for this gateway; 60 s by default, which is the same code path)."""
    gateway = start_gateway_process(state_dir, upstream.url, body_timeout_s=3)
    try:
        headers = {**gateway.auth, "Content-Type": "application/json", "Content-Length": "1000"}
        request = http_request("POST", CHAT, headers=headers) + b'{"model": "smol"'
        reply = await raw_exchange(gateway.url, request, local_host=fresh_client(),
                                   timeout=30, read_until_close=True)  # fmt: skip
    finally:
        gateway.stop()
    assert reply.closed, reply
    assert 2.5 < reply.seconds < 10, reply
    assert reply.status in (None, 408), reply.data[:300]


# --- injection ----------------------------------------------------------------------------

HOSTILE_NAMES = [
    "x'); DROP TABLE api_keys;--",
    "' OR '1'='1",
    'smol" OR 1=1 --',
    "smol\u202e",  # right-to-left override: reads as something else
    "\u202esmol",
    "smol\x00",
    "\x00",
    "smol\n",
    "🦦",
    "smol🦦",
    "\ud800",  # a lone surrogate (escaped in JSON; not encodable as UTF-8)
    "a" * 10_000,
    "%s%s%s%n",
    "../../etc/passwd",
]


def url_quoted(name: str) -> str:
    # A lone surrogate goes as the bytes a careless encoder would produce (ED A0 80).
    return quote(name.encode("utf-8", "surrogatepass"), safe="")


async def test_hostile_names_find_nothing_and_leave_the_tables_intact(
    gateway: GatewayProcess, store: Store
) -> None:
    ok = await raw_exchange(gateway.url, chat(gateway.auth), local_host=fresh_client())
    assert ok.status == 200, ok.data[:300]
    # The gateway is shared with earlier tests: wait until their usage is flushed too, so the
    # snapshot below is the settled state (two reads a flush interval apart agree).
    usage_before = await store.usage()
    for _ in range(100):
        await asyncio.sleep(0.3)
        latest = await store.usage()
        if latest and latest == usage_before:
            break
        usage_before = latest
    keys_before = {k.key_id for k in await store.list_keys()}
    assert usage_before, "no usage row to protect"

    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False) as client:
        for name in HOSTILE_NAMES:
            body = json.dumps({"model": name, "messages": []})
            for path in (CHAT, "/v1/completions", "/v1/embeddings"):
                reply = await client.post(path, content=body, headers={
                    **gateway.auth, "Content-Type": "application/json"})  # fmt: skip
                assert reply.status_code in (400, 404), (name, path, reply.text)
                if reply.status_code == 404:
                    assert reply.json()["error"]["code"] == "model_not_found", reply.text
            # The admin API's filters reach the store's queries directly.
            for param in ("model", "key_id"):
                reply = await client.get(f"/admin/v1/usage?{param}={url_quoted(name)}")
                assert reply.status_code in (200, 400, 414), (name, param, reply.text)
                if reply.status_code == 200:
                    assert reply.json()["data"] == []
            # Key names and ids: created, revoked.
            reply = await client.post("/admin/v1/keys", content=json.dumps({"name": name}),
                                      headers={"Content-Type": "application/json"})  # fmt: skip
            assert reply.status_code == 400, (name, reply.text)
            reply = await client.delete(f"/admin/v1/keys/{url_quoted(name)}",
                                        headers={"Content-Type": "application/json"})  # fmt: skip
            # 414: a 10,000-character name does not fit in a URL at all.
            assert reply.status_code in (400, 404, 414), (name, reply.text)
            if reply.status_code == 404:
                # not_found: a name with "/" in it (uvicorn decodes %2F) matches no route.
                assert reply.json()["error"]["code"] in ("key_not_found", "not_found"), reply.text
            # And a key_id is read out of the Authorization header.
            try:
                reply = await client.get("/v1/models", headers={
                    "Authorization": f"Bearer llmgw-{name}-{'D' * 43}"})  # fmt: skip
            except (httpx.LocalProtocolError, UnicodeEncodeError):
                continue  # not sendable as a header at all
            assert reply.status_code in (400, 401), (name, reply.text)

    assert {k.key_id for k in await store.list_keys()} == keys_before
    assert await store.usage() == usage_before
    still = await raw_exchange(gateway.url, chat(gateway.auth), local_host=fresh_client())
    assert still.status == 200, still.data[:300]
