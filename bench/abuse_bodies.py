"""What the hostile-client benchmark sends: request bodies, bad keys and source addresses.

Pure functions, unit-tested (tests/unit/test_bench_abuse.py). Bodies are built as bytes once
and sent many times, so the clients spend their core on sending, not on encoding JSON.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator

MODEL = "mock"
# One token id per prompt, as a list: `[[0],[0],...]` is the cheapest body per prompt (4 bytes),
# so the most prompts, choices and billing entries per byte a client can send.
ONE_TOKEN_PROMPT = b"[0]"
# The good client's completions are short: latency measures the gateway, not the stand-in.
GOOD_MAX_TOKENS = 16
KEY_ID_CHARS = "0123456789abcdef"
SECRET_CHARS = string.ascii_letters + string.digits + "-_"


def _json(value: object) -> bytes:
    # ensure_ascii (the default) writes a lone surrogate as its \\uXXXX escape: the bytes stay
    # valid UTF-8, and the surrogate only appears once the gateway parses the JSON.
    return json.dumps(value, separators=(",", ":")).encode()


def good_body(stream: bool) -> bytes:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": GOOD_MAX_TOKENS,
    }
    if stream:
        body["stream"] = True
    return _json(body)


def prompt_array_body(prompts: int, max_tokens: int = 1) -> bytes:
    """A /v1/completions body of `prompts` one-token prompts, `[[0],[0],...]`, written
    directly: 20,000 prompts are 80 KB, a million 4 MB."""
    if prompts < 1:
        raise ValueError("at least one prompt")
    head = b'{"model":"%s","max_tokens":%d,"prompt":[' % (MODEL.encode(), max_tokens)
    return head + b",".join([ONE_TOKEN_PROMPT] * prompts) + b"]}"


def prompts_for_bytes(size: int) -> int:
    """How many one-token prompts make a body of about `size` bytes."""
    return max(1, size // (len(ONE_TOKEN_PROMPT) + 1))


def big_body(size: int) -> bytes:
    """A chat body of exactly `size` bytes, nearly all of it one user message of short words:
    what a client with a large document (or a hostile one) sends."""
    shell = _json({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": ""}]})
    room = size - len(shell)
    if room < 0:
        raise ValueError(f"a body needs at least {len(shell)} bytes")
    words = (b"lorem " * (room // 6 + 1))[:room]
    at = shell.index(b'"content":""') + len(b'"content":"')
    return shell[:at] + words + shell[at:]


def slow_stream_body(chunks: int) -> bytes:
    """A streamed chat request for `chunks` tokens: the stand-in answers one SSE event per
    token, so a long answer is several megabytes, more than socket buffers hold."""
    return _json(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": chunks,
            "stream": True,
        }
    )


def surrogate_bodies(max_tokens: int = 1000) -> list[tuple[str, bytes]]:
    """(path, body) pairs, each holding lone UTF-16 surrogates as JSON escapes: valid JSON
    that Python parses into a str that cannot be encoded to UTF-8, in each place the gateway
    reads text from (message content, a prompt, the `user` field, many of them in a long
    message). `max_tokens` makes each a sizeable reservation against a token budget."""
    chat = "/v1/chat/completions"

    def message(content: str) -> dict[str, object]:
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        }

    return [
        (chat, _json(message("hi \ud800 there"))),
        ("/v1/completions", _json({"model": MODEL, "prompt": "\udc00", "max_tokens": max_tokens})),
        (chat, _json({**message("hello"), "user": "\udbff"})),
        (chat, _json(message("\ud83d" * 20_000))),
    ]


def hole_requests(key: str, host: str) -> list[tuple[str, bytes]]:
    """Issue 30's last holes, each a whole request (label, bytes): every one should be a 400."""
    chat = [{"role": "user", "content": "Say hi."}]
    inside = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:8001/admin/v1/keys"}}
    bodies = [
        ("n_predict -1", "/v1/chat/completions", _json(
            {"model": MODEL, "messages": chat, "max_tokens": 1, "n_predict": -1})),
        ("n_predict 1e9", "/v1/chat/completions",
            b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":1,'
            b'"n_predict":1e9}' % MODEL.encode()),
        ("n_probs 1000000", "/v1/completions", _json(
            {"model": MODEL, "prompt": "hi", "max_tokens": 1, "n_probs": 1_000_000})),
        ("image_url inside", "/v1/chat/completions", _json(
            {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user",
                                                              "content": [inside]}]})),
        ("duplicate keys", "/v1/chat/completions",
            b'{"model":"%s","model":"other","messages":[{"role":"user","content":"hi"}]}'
            % MODEL.encode()),
    ]  # fmt: skip
    requests = [(label, request_bytes(path, body, key, host)) for label, path, body in bodies]
    body = good_body(False)
    chunked = (
        b"POST /v1/chat/completions HTTP/1.0\r\nHost: " + host.encode() + b"\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    return [*requests, ("HTTP/1.0 chunked", chunked)]


def bad_key(rng: random.Random) -> str:
    """A well-formed key that exists nowhere: a random key id (so each costs the gateway a
    store lookup) and a random secret."""
    key_id = "".join(rng.choices(KEY_ID_CHARS, k=8))
    secret = "".join(rng.choices(SECRET_CHARS, k=43))
    return f"llmgw-{key_id}-{secret}"


def spray_addresses(block: int) -> Iterator[str]:
    """Loopback source addresses for the bad-key spray, 127.<block>.x.y: all of 127.0.0.0/8
    reaches this machine, so one client can look like 65,000. A block per phase, so no phase
    inherits an address another phase brought near the lockout."""
    if not 1 <= block <= 255:
        raise ValueError("block is 1..255 (127.0.x.y is for the other clients)")
    for third in range(256):
        for fourth in range(1, 255):
            yield f"127.{block}.{third}.{fourth}"


def request_bytes(path: str, body: bytes, authorization: str | None, host: str) -> bytes:
    """One HTTP/1.1 POST, head and body, ready to write."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if authorization:
        lines.append(f"Authorization: Bearer {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
