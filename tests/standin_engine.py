#!/usr/bin/env python3
"""A stand-in for llama.cpp's llama-server: the same HTTP surface, no model, instant replies.

Fast enough to run many integration scenarios (kills and restarts included); it never replaces
the end-to-end tests against the real llama-server. Run it as llama-server would be run:

    python tests/standin_engine.py --host H --port P -m FILE [other llama-server flags]

Mirrors the real server where a client can tell: every path answers 503 "Loading model" for
the first --load-delay seconds; then /health needs no key and everything else wants
`Authorization: Bearer <LLAMA_API_KEY>` (a comma-separated list, as llama-server takes it).
Replies are deterministic: the last user message's first words, echoed back.

Fault injection through the environment:
  STANDIN_DIE_AFTER_CHUNKS=N  exit(1) in the middle of a stream after N chunks.
  STANDIN_TOKEN_DELAY_S=F     sleep F seconds between streamed chunks (load tests).
  STANDIN_FAIL_LOAD=TEXT      exit(1) while loading, after logging the way vLLM does when its
                              engine core fails: the cause (TEXT) first, then the exceptions
                              it caused, ending in one that says "see root cause above".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

VERSION_LINE = "version: 1 (standin)"
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
ECHO_WORDS = 8


class Engine:
    """The state one stand-in process keeps: readiness clock, slots and token counters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.model_id = args.alias or Path(args.model).name
        self.keys = [k for k in os.environ.get("LLAMA_API_KEY", "").split(",") if k]
        self.ready_at: float = time.monotonic() + args.load_delay
        self.metrics_enabled = args.metrics
        self.parallel = max(1, args.parallel)
        self.in_flight = 0
        self.prompt_tokens_total = 0
        self.tokens_predicted_total = 0
        self.die_after_chunks = int(os.environ.get("STANDIN_DIE_AFTER_CHUNKS", "0") or 0)
        self.token_delay_s = float(os.environ.get("STANDIN_TOKEN_DELAY_S", "0") or 0)

    def loading(self) -> bool:
        return time.monotonic() < self.ready_at


def error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"code": status, "message": message, "type": kind}}
    return web.json_response(body, status=status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def gatekeeper(request: web.Request, handler: Handler) -> web.StreamResponse:
    # llama-server checks readiness before the key: a loading server says 503 to everyone.
    engine: Engine = request.app["engine"]
    if engine.loading():
        return error(503, "Loading model", "unavailable_error")
    if engine.keys and request.path not in PUBLIC_PATHS:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if given not in engine.keys:
            return error(401, "Invalid API Key", "authentication_error")
    return await handler(request)


def words(text: str) -> list[str]:
    return text.split()


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def plan_reply(prompt: str, max_tokens: int | None) -> tuple[list[str], str]:
    """The reply's pieces (one "token" per word) and its finish reason."""
    reply = ["echo:", *words(prompt)[:ECHO_WORDS]]
    if max_tokens is not None and max_tokens < len(reply):
        return reply[: max(0, max_tokens)], "length"
    return reply, "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    engine: Engine = request.app["engine"]
    entry = {"id": engine.model_id, "object": "model", "created": 0, "owned_by": "llamacpp"}
    return web.json_response({"object": "list", "data": [entry]})


async def metrics(request: web.Request) -> web.Response:
    engine: Engine = request.app["engine"]
    if not engine.metrics_enabled:
        return error(
            501,
            "This server does not support metrics endpoint. Start it with `--metrics`",
            "not_supported_error",
        )
    processing = min(engine.in_flight, engine.parallel)
    deferred = max(0, engine.in_flight - engine.parallel)
    lines = []
    for name, kind, value in (
        ("prompt_tokens_total", "counter", engine.prompt_tokens_total),
        ("tokens_predicted_total", "counter", engine.tokens_predicted_total),
        ("requests_processing", "gauge", processing),
        ("requests_deferred", "gauge", deferred),
    ):
        lines += [f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def tokenize(request: web.Request) -> web.Response:
    body = await request.json()
    tokens = [sum(w.encode()) for w in words(str(body.get("content", "")))]
    return web.json_response({"tokens": tokens})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    messages = body.get("messages") or []
    prompt_all = " ".join(message_text(m.get("content")) for m in messages)
    users = [m for m in messages if m.get("role") == "user"]
    last_user = message_text(users[-1].get("content")) if users else ""
    return await complete(request, body, "chat", prompt_all, last_user)


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt = body.get("prompt", "")
    # Token ids (or arrays of them) are prompts too: echo them as text.
    prompt = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
    return await complete(request, body, "text", prompt, prompt)


def choice(kind: str, piece: str | None, finish: str | None, first: bool) -> dict[str, Any]:
    if kind == "text":
        return {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
    delta: dict[str, Any] = {}
    if first:
        delta["role"] = "assistant"
    if piece is not None:
        delta["content"] = piece
    return {"index": 0, "delta": delta, "finish_reason": finish}


async def complete(
    request: web.Request, body: dict[str, Any], kind: str, prompt_all: str, prompt_echo: str
) -> web.StreamResponse:
    engine: Engine = request.app["engine"]
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    pieces, finish = plan_reply(prompt_echo, max_tokens)
    prompt_tokens = len(words(prompt_all))
    engine.in_flight += 1
    try:
        engine.prompt_tokens_total += prompt_tokens
        base = {
            "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": body.get("model") or engine.model_id,
            "system_fingerprint": "b1-standin",
        }
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await stream(
                request, engine, base, kind, pieces, finish, prompt_tokens, include_usage
            )
        text = " ".join(pieces)
        engine.tokens_predicted_total += len(pieces)
        if kind == "chat":
            answer = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            answer = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return web.json_response(
            {**base, "object": obj, "choices": [answer], "usage": usage(prompt_tokens, len(pieces))}
        )
    finally:
        engine.in_flight -= 1


async def stream(
    request: web.Request,
    engine: Engine,
    base: dict[str, Any],
    kind: str,
    pieces: list[str],
    finish: str,
    prompt_tokens: int,
    include_usage: bool,
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    sent = 0

    async def send(payload: dict[str, Any] | str) -> None:
        nonlocal sent
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await response.write(f"data: {data}\n\n".encode())
        sent += 1
        if engine.die_after_chunks and sent >= engine.die_after_chunks:
            await response.drain()
            os._exit(1)  # a crash mid-stream: no final chunk, no [DONE]
        if engine.token_delay_s:
            await asyncio.sleep(engine.token_delay_s)

    if kind == "chat":
        await send({**base, "object": obj, "choices": [choice(kind, "", None, True)]})
    for i, piece in enumerate(pieces):
        text = piece if i == 0 else " " + piece
        await send({**base, "object": obj, "choices": [choice(kind, text, None, False)]})
        engine.tokens_predicted_total += 1
    await send({**base, "object": obj, "choices": [choice(kind, None, finish, False)]})
    if include_usage:
        await send(
            {**base, "object": obj, "choices": [], "usage": usage(prompt_tokens, len(pieces))}
        )
    await send("[DONE]")
    await response.write_eof()
    return response


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-m", "--model", default="model.gguf")
    parser.add_argument("-a", "--alias", default="")
    parser.add_argument("-np", "--parallel", type=int, default=1)
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--load-delay", type=float, default=0.3)
    # Every other llama-server flag (-c, -t, ...) is accepted and ignored.
    args, _ignored = parser.parse_known_args(argv)
    return args


def build_app(args: argparse.Namespace) -> web.Application:
    app = web.Application(middlewares=[gatekeeper])
    app["engine"] = Engine(args)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/completions", completions)
    return app


def fail_loading(cause: str, delay_s: float) -> None:
    time.sleep(delay_s)
    lines = [
        "ERROR EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "core.py", line 12, in run_engine_core',
        "    raise RuntimeError(",
        f"RuntimeError: {cause}",
        "Traceback (most recent call last):",
        '  File "utils.py", line 1431, in wait_for_engine_startup',
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.version:
        # llama-server prints its version to stderr.
        print(VERSION_LINE, file=sys.stderr)
        print("built with standin for python", file=sys.stderr)
        return 0
    failure = os.environ.get("STANDIN_FAIL_LOAD")
    if failure:
        fail_loading(failure, args.load_delay)
        return 1
    if not Path(args.model).is_file():
        print(f"error: failed to open model file {args.model}", file=sys.stderr, flush=True)
        return 1
    print(
        f"main: server is listening on http://{args.host}:{args.port}", file=sys.stderr, flush=True
    )
    web.run_app(build_app(args), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
