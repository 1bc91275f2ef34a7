"""What the router needs to know about a request: its model, the bytes its prompt starts with,
and the client's session if it named one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# ASCII unit and record separators between fields, so ("ab", "c") and ("a", "bc") differ. Text
# could contain them, but a collision would only mislead one routing hint.
_FIELD = b"\x1f"
_RECORD = b"\x1e"


@dataclass(frozen=True, slots=True)
class RequestKey:
    model: str
    prompt: bytes
    session: str | None = None


def prompt_bytes(body: Mapping[str, Any]) -> bytes:
    """The text an engine turns into the prompt's tokens, in the order its chat template lays it
    out (tools, then each message), from an OpenAI chat or completions body.

    Not the request body's bytes: fields such as max_tokens, temperature or stream sit among the
    messages in client JSON and differ between requests that share a system prompt, so two
    requests with the same prefix of tokens would share no prefix of bytes.
    """
    parts: list[bytes] = []
    tools = body.get("tools")
    if tools:
        parts.append(_dumps(tools))
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            content = message.get("content")
            text = content if isinstance(content, str) else _dumps(content).decode()
            parts.append(str(message.get("role", "")).encode() + _FIELD + text.encode())
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            parts.append(prompt.encode())
        elif prompt is not None:
            parts.append(_dumps(prompt))
    return _RECORD.join(parts)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
