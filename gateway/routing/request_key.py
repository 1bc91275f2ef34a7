"""What the router needs to know about a request: its model, the bytes its prompt starts with,
the client's session if it named one, and for models whose replicas publish KV events the
prompt's token ids and cache salt (gateway/tokenize.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.routing.prefix_index import BLOCK_BYTES, MAX_BLOCKS

# ASCII unit and record separators between fields, so ("ab", "c") and ("a", "bc") differ. Text
# could contain them, but a collision would only mislead one routing hint.
_FIELD = b"\x1f"
_RECORD = b"\x1e"
# The prefix index hashes a prompt's first MAX_BLOCKS blocks only: bytes past those would cost
# time and memory (up to the whole 16 MB of a large body) and change no decision.
PROMPT_LIMIT = BLOCK_BYTES * MAX_BLOCKS


@dataclass(frozen=True, slots=True)
class RequestKey:
    model: str
    prompt: bytes
    session: str | None = None
    # The prompt as the engine tokenizes it, when the gateway asked one (gateway/tokenize.py):
    # the router then scores replicas by the blocks their engines report holding.
    token_ids: tuple[int, ...] | None = None
    # True: `token_ids` are only what a chat begins with before its last message's content
    # (gateway/prefix_tokens.py); the prompt goes on past them, so every full block of them can
    # come from the engine's cache.
    leading_only: bool = False
    # The prompt's length in tokens: exact with the whole prompt's ids, estimated with
    # `leading_only`; 0 where unknown.
    prompt_tokens: int = 0
    # The body's `cache_salt` (vLLM): it changes the prompt's block hashes.
    cache_salt: str | None = None
    # The LoRA adapter asked for: it changes every block's hash (gateway/routing/kv_blocks.py).
    adapter: str | None = None
    # True: without `token_ids` now, they are being asked aside (a prompt starting a new prefix,
    # gateway/tokenize.py); Router.tokens_arrived gives them to the record of what its engine is
    # about to store.
    tokens_later: bool = False
    # The prompt's block keys as the router's prefix index hashes them (Router.prompt_keys),
    # hashed once for every step that reads them (Router.needs_no_tokens, each choice, `sent`);
    # None: hashed where needed. Derived from `prompt`, so no part of equality.
    prompt_keys: Sequence[int] | None = field(default=None, compare=False)


def prompt_bytes(body: Mapping[str, Any], limit: int = PROMPT_LIMIT) -> bytes:
    """The text an engine turns into the prompt's tokens, in the order its chat template lays it
    out (tools, then each message), from an OpenAI chat or completions body.

    Not the request body's bytes: fields such as max_tokens, temperature or stream sit among the
    messages in client JSON and differ between requests that share a system prompt, so two
    requests with the same prefix of tokens would share no prefix of bytes.

    Cut at `limit` bytes, stopping before later messages once it is reached.
    """
    parts: list[bytes] = []
    size = 0
    tools = body.get("tools")
    if tools:
        parts.append(_dumps(tools))
        size += len(parts[-1])
    messages = body.get("messages")
    if isinstance(messages, list):
        # _encode written out in the loop below: it runs twice per message of every request.
        for message in messages:
            # A parsed body's messages are dicts: `type` answers for them without the ABC's
            # isinstance check (measured on a 100-message chat: 24.6 us to 17.9).
            if type(message) is not dict and not isinstance(message, Mapping):
                continue
            if size >= limit:
                break  # the index never looks past `limit`: a huge conversation stops here
            content = message.get("content")
            # A string is cut before it is encoded: its first `limit` characters encode to at
            # least `limit` bytes, all the cut below keeps (a 200 KB message: 64 KB encoded).
            if isinstance(content, str):
                text = content[:limit].encode("utf-8", "surrogatepass")
            else:
                text = _dumps(content)
            part = str(message.get("role", "")).encode("utf-8", "surrogatepass") + _FIELD + text
            parts.append(part)
            size += len(part) + 1
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            parts.append(_encode(prompt[:limit]))
        elif prompt is not None:
            parts.append(_dumps(prompt))
    return _RECORD.join(parts)[:limit]


def _encode(text: str) -> bytes:
    # surrogatepass: request_body refuses lone surrogates, but routing is only a hint and must
    # never be what raises on a client's text.
    return text.encode("utf-8", "surrogatepass")


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    except (RecursionError, ValueError, TypeError):
        return b""  # nested deeper than the encoder goes: no prefix to route on
