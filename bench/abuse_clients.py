"""The hostile-client benchmark's clients, each phase's in a process of their own: the good
client in one, every abuse kind of the phase together in another (niced, so on a shared core
the good client's own scheduling is not what gets measured). Results go to a JSON file.

    python -m bench.abuse_clients good --port P --keys FILE --duration S --out FILE
    python -m bench.abuse_clients abuse --kinds big,slow --port P --keys FILE ...

Abuse kinds (each from a loopback address of its own, so a lockout never reaches another):
  prompts     /v1/completions with 20,000 one-token prompts (80 KB), 4 a second
  prompts-mb  /v1/completions with a multi-MB `[[0],[0],...]` body, 1 a second
  slow        streams of megabytes read one byte a second, or not at all
  big         16 MB bodies with a valid key, several at once
  bad-keys    random keys from ever new addresses, under the lockout's threshold on each
  lockout     random keys from one address, past the lockout
  surrogates  lone UTF-16 surrogates in JSON, against a key with a token budget
  holes       issue 30's last holes (n_predict -1 and 1e9, n_probs 1000000, an image_url of the
              admin API, duplicate keys, HTTP/1.0 chunked), each labelled: all should be 400
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

import uvloop

from bench.abuse_bodies import (
    bad_key,
    big_body,
    good_body,
    hole_requests,
    prompt_array_body,
    prompts_for_bytes,
    request_bytes,
    slow_stream_body,
    spray_addresses,
    surrogate_bodies,
)
from bench.abuse_net import (
    HOST,
    Failed,
    connect,
    exchange,
    one_request,
    paced,
    server_side_states,
)
from bench.abuse_report import AbuseFigures, GoodFigures, count
from gateway.settings import GatewaySettings

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GOOD_TIMEOUT_S = 30.0
KINDS = (
    "prompts",
    "prompts-mb",
    "slow",
    "big",
    "bad-keys",
    "lockout",
    "surrogates",
    "holes",
)
SOURCES = {
    "prompts": "127.0.0.2",
    "prompts-mb": "127.0.0.3",
    "slow": "127.0.0.4",
    "big": "127.0.0.5",
    "lockout": "127.0.0.6",
    "surrogates": "127.0.0.7",
    "holes": "127.0.0.8",
}
# A receive buffer this small holds a few SSE events: what a reader does not take stays in
# the gateway's send buffer and then in the gateway itself.
SLOW_RCVBUF = 4096


async def good_client(
    port: int, key: str, rate: float, duration_s: float, warmup_s: float
) -> GoodFigures:
    """Chat completions at a steady `rate`, streamed and not in turn, on keep-alive
    connections, counted after `warmup_s` (connections opened, the gateway's caches warm).
    Open loop: a slow answer does not delay the next request, so a stall shows in the
    latencies instead of hiding in a lower rate."""
    figures = GoodFigures()
    host = f"{HOST}:{port}"
    requests = [request_bytes(CHAT, good_body(stream), key, host) for stream in (False, True)]
    idle: list[socket.socket] = []

    async def attempt(request: bytes) -> tuple[int, bool]:
        while idle:
            sock = idle.pop()
            try:
                reader = await exchange(sock, request)
            except Failed as exc:
                sock.close()
                if str(exc) in ("closed", "reset"):
                    continue  # a keep-alive connection the gateway closed while idle: retry
                raise
            (idle.append if reader.keep_alive else lambda s: s.close())(sock)
            return reader.status, reader.saw_done
        sock = await connect(port)
        try:
            reader = await exchange(sock, request)
        except Failed:
            sock.close()
            raise
        (idle.append if reader.keep_alive else lambda s: s.close())(sock)
        return reader.status, reader.saw_done

    async def one(i: int) -> list[str]:
        stream = i % 2 == 1
        started = time.perf_counter()
        counted = started >= measure_from
        try:
            async with asyncio.timeout(GOOD_TIMEOUT_S):
                status, saw_done = await attempt(requests[stream])
        except Failed as exc:
            return [str(exc)]
        except TimeoutError:
            return ["timeout"]
        if status != 200:
            return [f"HTTP {status}"]
        if stream and not saw_done:
            return ["stream without [DONE]"]
        if not counted:
            return []
        figures.latencies_s.append(time.perf_counter() - started)
        return ["ok"]

    measure_from = time.perf_counter() + warmup_s
    labels = await paced(warmup_s + duration_s, rate, 10_000, one, drain_s=GOOD_TIMEOUT_S)
    figures.sent = len(labels)
    figures.error_kinds = count(label for label in labels if label != "ok")
    figures.errors = sum(figures.error_kinds.values())
    for sock in idle:
        sock.close()
    return figures


def _requests_of(
    port: int, source: str, requests: list[bytes]
) -> Callable[[int], Awaitable[list[str]]]:
    async def send(i: int) -> list[str]:
        return [await one_request(port, requests[i % len(requests)], source)]

    return send


async def prompts(
    port: int, key: str, duration_s: float, _options: argparse.Namespace
) -> AbuseFigures:
    body = prompt_array_body(20_000)
    request = request_bytes(COMPLETIONS, body, key, f"{HOST}:{port}")
    send = _requests_of(port, SOURCES["prompts"], [request])
    labels = await paced(duration_s, 4, 4, send)
    return AbuseFigures(f"20,000 prompts ({len(body) // 1000} KB)", len(labels), count(labels))


async def prompts_mb(
    port: int, key: str, duration_s: float, options: argparse.Namespace
) -> AbuseFigures:
    body = prompt_array_body(prompts_for_bytes(options.prompt_mb * 1_000_000))
    request = request_bytes(COMPLETIONS, body, key, f"{HOST}:{port}")
    send = _requests_of(port, SOURCES["prompts-mb"], [request])
    labels = await paced(duration_s, 1, 2, send)
    kind = f"[[0],...] {len(body) / 1e6:.0f} MB"
    return AbuseFigures(kind, len(labels), count(labels))


async def big(port: int, key: str, duration_s: float, options: argparse.Namespace) -> AbuseFigures:
    request = request_bytes(CHAT, big_body(options.big_mb * 1_000_000), key, f"{HOST}:{port}")
    at_once = options.big_at_once

    async def burst(_i: int) -> list[str]:
        sends = (one_request(port, request, SOURCES["big"], 60.0) for _ in range(at_once))
        return list(await asyncio.gather(*sends))

    # A burst every 2 s: `at_once` bodies in flight together, and the gateway's memory given
    # a moment between bursts, so a leak shows as a rising floor.
    labels = await paced(duration_s, 0.5, 1, burst, drain_s=60.0)
    return AbuseFigures(
        f"{options.big_mb} MB bodies, {at_once} at once", len(labels), count(labels)
    )


async def bad_keys(
    port: int, _key: str, duration_s: float, options: argparse.Namespace
) -> AbuseFigures:
    """Never more failures from one address than the lockout allows: what a sprayer with many
    addresses costs the gateway, which the lockout does not slow."""
    per_address = GatewaySettings().auth_failures_before_lockout - 1
    addresses = spray_addresses(options.spray_block)
    address = next(addresses)
    rng = random.Random(11)
    host = f"{HOST}:{port}"
    body = good_body(False)
    used = itertools.count()

    async def send(i: int) -> list[str]:
        nonlocal address
        if next(used) and i % per_address == 0:
            address = next(addresses)
        request = request_bytes(CHAT, body, bad_key(rng), host)
        return [await one_request(port, request, address, 10.0)]

    labels = await paced(duration_s, options.bad_key_rate, 64, send)
    spread = f"{per_address} from each of {-(-len(labels) // per_address):,} addresses"
    return AbuseFigures("bad keys, many addresses", len(labels), count(labels), spread)


async def lockout(
    port: int, _key: str, duration_s: float, _options: argparse.Namespace
) -> AbuseFigures:
    rng = random.Random(12)
    host = f"{HOST}:{port}"
    body = good_body(False)

    async def send(_i: int) -> list[str]:
        request = request_bytes(CHAT, body, bad_key(rng), host)
        return [await one_request(port, request, SOURCES["lockout"], 10.0)]

    labels = await paced(duration_s, 20, 8, send)
    return AbuseFigures("bad keys, one address", len(labels), count(labels))


async def surrogates(
    port: int, budget_key: str, duration_s: float, _options: argparse.Namespace
) -> AbuseFigures:
    host = f"{HOST}:{port}"
    requests = [request_bytes(path, body, budget_key, host) for path, body in surrogate_bodies()]
    labels = await paced(duration_s, 20, 8, _requests_of(port, SOURCES["surrogates"], requests))
    # A refused request must not have spent the budget: the key still serves a clean one.
    after = await one_request(port, request_bytes(CHAT, good_body(False), budget_key, host))
    note = f"budget key afterwards: {after}"
    return AbuseFigures("lone surrogates, budget key", len(labels), count(labels), note)


async def holes(
    port: int, key: str, duration_s: float, _options: argparse.Namespace
) -> AbuseFigures:
    requests = hole_requests(key, f"{HOST}:{port}")

    async def send(i: int) -> list[str]:
        label, request = requests[i % len(requests)]
        return [f"{label}: {await one_request(port, request, SOURCES['holes'])}"]

    labels = await paced(duration_s, 10, 4, send)
    return AbuseFigures("issue 30's last holes", len(labels), count(labels))


async def slow(port: int, key: str, duration_s: float, options: argparse.Namespace) -> AbuseFigures:
    """`options.slow` streams of megabytes held open: half read a byte a second, half never
    read. A connection the gateway ends is opened again. At the end, the gateway's side of each
    connection still open is looked up in /proc/net/tcp: held, or closed by the gateway with
    its unsent bytes still queued (which the client, reading nothing, cannot see)."""
    loop = asyncio.get_running_loop()
    request = request_bytes(CHAT, slow_stream_body(options.slow_tokens), key, f"{HOST}:{port}")
    deadline = time.monotonic() + duration_s
    labels: list[str] = []
    cut_after: list[float] = []
    held: list[tuple[socket.socket, str, bytes]] = []

    async def trickle(sock: socket.socket, head: bytearray) -> str | None:
        while (left := deadline - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(left):
                    data = await loop.sock_recv(sock, 1)
            except TimeoutError:
                return None
            except ConnectionResetError:
                return "reset"
            if not data:
                return "cut"
            if len(head) < 12:
                head += data
            await asyncio.sleep(1.0)
        return None

    async def slot(mode: str) -> None:
        while time.monotonic() < deadline:
            try:
                sock = await connect(port, SOURCES["slow"], rcvbuf=SLOW_RCVBUF)
                await loop.sock_sendall(sock, request)
            except (Failed, OSError) as exc:
                labels.append(f"{mode}: {exc}")
                await asyncio.sleep(0.5)
                continue
            opened = time.monotonic()
            head = bytearray()
            if mode == "1 B/s":
                outcome = await trickle(sock, head)
            else:
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                outcome = None
            if outcome is None:
                held.append((sock, mode, bytes(head)))
                return
            cut_after.append(time.monotonic() - opened)
            labels.append(f"{mode} {_status(bytes(head))}: {outcome}")
            sock.close()

    modes = ["1 B/s", "never reads"] * (options.slow // 2) + ["1 B/s"] * (options.slow % 2)
    await asyncio.gather(*(slot(mode) for mode in modes))
    labels += _held_labels(port, held)
    for sock, _, _ in held:
        sock.close()
    note = f"ended after median {statistics.median(cut_after):.0f} s" if cut_after else ""
    return AbuseFigures(
        f"slow readers x{options.slow} ({options.slow_tokens * 170 // 1_000_000} MB streams)",
        len(labels),
        count(labels),
        note,
    )


def _status(head: bytes) -> str:
    return head[9:12].decode() if len(head) >= 12 else "?"


def _held_labels(port: int, held: list[tuple[socket.socket, str, bytes]]) -> list[str]:
    """Labels for the connections still open at the end, by the gateway's side of each."""
    try:
        with open("/proc/net/tcp") as f:
            table = f.read()
    except OSError:
        table = ""
    ends = {sock.getsockname(): (sock, mode, head) for sock, mode, head in held}
    states = server_side_states(table, port, ends) if table else {}
    labels = []
    for name, (sock, mode, head) in ends.items():
        if len(head) < 12:
            # What a slow reader has not read yet is still in its buffer: peek at the rest.
            with contextlib.suppress(OSError):
                head += sock.recv(12 - len(head), socket.MSG_PEEK | socket.MSG_DONTWAIT)
        state = states.get(name, "unknown")
        seen = "held by gateway" if state == "ESTABLISHED" else f"gateway side {state}"
        labels.append(f"{mode} {_status(head)}: {seen}")
    return labels


ABUSERS = {
    "prompts": prompts,
    "prompts-mb": prompts_mb,
    "slow": slow,
    "big": big,
    "bad-keys": bad_keys,
    "lockout": lockout,
    "surrogates": surrogates,
    "holes": holes,
}


async def abuse(options: argparse.Namespace, keys: dict[str, str]) -> list[AbuseFigures]:
    runs = []
    for kind in options.kinds.split(","):
        key = keys["budget" if kind == "surrogates" else "abuse"]
        runs.append(ABUSERS[kind](options.port, key, options.duration, options))
    return list(await asyncio.gather(*runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.abuse_clients")
    parser.add_argument("role", choices=("good", "abuse"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--keys", type=Path, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--prompt-mb", type=int, default=4)
    parser.add_argument("--big-mb", type=int, default=16)
    parser.add_argument("--big-at-once", type=int, default=4)
    parser.add_argument("--slow", type=int, default=16)
    parser.add_argument("--slow-tokens", type=int, default=100_000)
    parser.add_argument("--bad-key-rate", type=float, default=200.0)
    parser.add_argument("--spray-block", type=int, default=1)
    options = parser.parse_args(argv)
    keys = json.loads(options.keys.read_text())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        if options.role == "good":
            result: object = asdict(
                runner.run(
                    good_client(
                        options.port, keys["good"], options.rate, options.duration, options.warmup
                    )
                )
            )
        else:
            os.nice(options.nice)
            result = [asdict(f) for f in runner.run(abuse(options, keys))]
    options.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
