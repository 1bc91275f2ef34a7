"""The token ids of a chat's leading messages, remembered so most KV-routed requests need no
round trip to an engine's /tokenize.

Traffic that gains from KV routing repeats its leading messages: a tenant's system prompt, a
few-shot preamble, the conversation so far. The blocks that can be found in an engine's cache
are those leading messages' blocks; the last message is new. So the gateway keeps, per model,
the token ids of a body's messages but the last (with its tools, template and template
arguments), and routes a request whose leading messages it has seen on those alone.

That is exact only if the chat template renders the leading messages the same whatever follows
them. Most do (ChatML, Llama 3's, Qwen's); some do not (Mistral's puts the system prompt into
the last user message). So nothing is kept on trust: a prefix is learned only by tokenizing it
and the whole prompt together, on the same engine, and kept only when its ids are a strict
prefix of the whole prompt's. A model whose template failed that MISMATCHES_OFF times is asked
for whole prompts only from then on (until the gateway restarts). What no check catches: a
template that renders leading messages one way for some last messages and another way for
others, after agreeing on the ones it was checked with.

Learning costs the engine a second tokenization, so a leading part is learned the second
time it is seen, not the first: a conversation's every turn has leading messages never seen
before (the last turn's, plus the reply), and pays one /tokenize per request as without this.

Bounded: at most MAX_TOKENS token ids in all (4 bytes each) and SEEN_KEYS keys of parts seen
once (about 100 bytes each), least recently used first out.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

# About 4 MB of token ids: 3,000 distinct leading parts of 330 tokens, or 30 of 33,000.
MAX_TOKENS = 1_000_000
# Leading parts remembered as seen once, by key.
SEEN_KEYS = 16_384
# Template disagreements before a model's prefixes are no longer learned.
MISMATCHES_OFF = 3
# Body fields that shape how the leading messages render, besides the messages themselves.
_SHAPING = ("tools", "chat_template", "chat_template_kwargs", "add_special_tokens")


def leading_messages(body: Mapping[str, Any]) -> list[Any] | None:
    """A chat body's messages but the last, when there are any and each is a message object."""
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    if not all(isinstance(m, Mapping) for m in messages):
        return None
    return messages[:-1]


def prefix_fields(body: Mapping[str, Any], leading: list[Any]) -> dict[str, Any]:
    """A /tokenize chat body for the leading messages alone, rendered as history (no prompt for
    the assistant's turn)."""
    fields: dict[str, Any] = {"model": body.get("model"), "messages": leading}
    for name in _SHAPING:
        if name in body:
            fields[name] = body[name]
    fields["add_generation_prompt"] = False
    return fields


def prefix_key(fields: Mapping[str, Any]) -> bytes | None:
    """What identifies a leading part: everything its rendering depends on (the model and
    adapter name included); None for a body JSON cannot encode."""
    try:
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class PrefixTokens:
    def __init__(self, max_tokens: int = MAX_TOKENS, seen_keys: int = SEEN_KEYS) -> None:
        self._max_tokens = max_tokens
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._tokens = 0
        self._seen_keys = seen_keys
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        # model -> how often its template rendered leading messages unlike the whole prompt.
        # Keyed by the names of models with routes only (callers check), so it stays small.
        self._mismatches: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def learns(self, model: str) -> bool:
        """Whether this model's leading parts are kept (its template has not failed the check)."""
        return self._mismatches.get(model, 0) < MISMATCHES_OFF

    def get(self, key: bytes) -> tuple[int, ...] | None:
        ids = self._entries.get(key)
        if ids is None:
            return None
        self._entries.move_to_end(key)
        return tuple(ids)

    def seen_before(self, key: bytes) -> bool:
        """Whether this leading part was seen before (then it is worth learning); the first
        time, it is noted and False."""
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = None
        if len(self._seen) > self._seen_keys:
            self._seen.popitem(last=False)
        return False

    def learn(
        self, model: str, key: bytes, leading: tuple[int, ...], whole: tuple[int, ...]
    ) -> bool:
        """Keep `leading` (the leading messages' ids) if they begin `whole` (the prompt's, from
        the same engine) and something follows; else count a mismatch against the model.
        True when kept."""
        if not leading or len(leading) >= len(whole) or whole[: len(leading)] != leading:
            self._mismatches[model] = self._mismatches.get(model, 0) + 1
            return False
        if len(leading) > self._max_tokens:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._tokens -= len(old)
        while self._entries and self._tokens + len(leading) > self._max_tokens:
            _, dropped = self._entries.popitem(last=False)
            self._tokens -= len(dropped)
        self._entries[key] = array("I", leading)
        self._tokens += len(leading)
        return True
