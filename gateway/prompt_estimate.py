"""An upper bound on a request's prompt tokens, without a tokenizer: what the quota book
reserves before the engine says how many there were (gateway/quota.py)."""

from __future__ import annotations

import json
from typing import Any, Final

# Chat templates wrap each message in role markers and separators: a handful of tokens (about 4
# for OpenAI's, up to ~10 for Llama 3's header tokens), rounded up.
MESSAGE_OVERHEAD_TOKENS: Final = 12
# The template's own text around the conversation and its start-of-reply marker, plus the BOS a
# completion prompt gets.
REQUEST_OVERHEAD_TOKENS: Final = 16
# The preamble a template writes before tool definitions ("You have access to the following
# functions...") and the wrapping around each one.
TOOLS_OVERHEAD_TOKENS: Final = 256
PER_TOOL_OVERHEAD_TOKENS: Final = 16
# Bytes do not bound what an image or a clip becomes: a vision encoder turns it into a number of
# tokens that depends on its resolution, not on the size of its base64. This is generous for
# OpenAI-style tiling (at most ~1,500) and for most open models at their default resolution; a
# model configured for very large images can exceed it.
MEDIA_PART_TOKENS: Final = 4_096


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """An upper bound on the prompt tokens of an OpenAI chat, completions or embeddings body,
    without a tokenizer.

    Text is counted in UTF-8 bytes: byte-level BPE (GPT-2, tiktoken, Llama 3, Qwen) starts from
    one token per byte and only merges, and SentencePiece with byte fallback emits at most one
    token per byte as well, so no tokenizer of that kind makes more tokens than the text has
    bytes. What bytes do not cover, the template's markers and media parts, is added as fixed,
    generous amounts. The bound is loose (English runs at about four bytes a token), which is
    the price of never under-reserving."""
    total = REQUEST_OVERHEAD_TOKENS
    messages = body.get("messages")
    if isinstance(messages, list):
        total += MESSAGE_OVERHEAD_TOKENS * len(messages)
        # A message's fields counted here rather than in a function per message, and a string
        # (a role, a content) without _string_bytes's stack: measured on a 100-message chat
        # (shared 2-core VM), 57 us to 22.
        for message in messages:
            if not isinstance(message, dict):
                continue
            for field, value in message.items():
                if isinstance(value, str):
                    total += len(value) if value.isascii() else _utf8_length(value)
                elif field == "content" and isinstance(value, list):
                    for part in value:
                        total += _content_part_tokens(part)
                else:
                    # tool_calls' names and arguments are rendered into the prompt too.
                    total += _string_bytes(value)
    for field in ("prompt", "input", "suffix"):
        value = body.get(field)
        if value is not None:
            total += _prompt_tokens(value)
    for field in ("tools", "functions"):
        definitions = body.get(field)
        if isinstance(definitions, list) and definitions:
            # The template renders them as JSON; json.dumps escapes non-ASCII as \uXXXX, six
            # bytes for a character of at most four, so its length bounds the UTF-8 rendering.
            total += TOOLS_OVERHEAD_TOKENS + PER_TOOL_OVERHEAD_TOKENS * len(definitions)
            total += len(json.dumps(definitions))
    return total


def _content_part_tokens(part: object) -> int:
    if isinstance(part, str):
        return _utf8_length(part)
    if not isinstance(part, dict):
        return 0
    text = part.get("text")
    if isinstance(text, str):
        return _utf8_length(text)
    refusal = part.get("refusal")
    if isinstance(refusal, str):
        return _utf8_length(refusal)
    # image_url, input_image, input_audio, file: what they become is not bounded by their bytes.
    return MEDIA_PART_TOKENS


def _prompt_tokens(value: object) -> int:
    """A completions prompt or an embeddings input: a string, strings, token ids, or lists of
    token ids (which count exactly)."""
    # Iterative, like _string_bytes: json.loads nests as deep as the recursion limit.
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += _utf8_length(item)
        elif isinstance(item, int):
            total += 1
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _string_bytes(value: object) -> int:
    """The UTF-8 bytes of every string inside `value`, keys included. Iterative: a recursive
    walk of a body json.loads nested near the recursion limit would raise RecursionError."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += _utf8_length(item)
        elif isinstance(item, dict):
            total += sum(_utf8_length(str(k)) for k in item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _utf8_length(text: str) -> int:
    # isascii is a flag check on CPython's str: no copy for the common case.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
