"""The token ids that chats sharing their leading messages all begin with, learned so most
KV-routed requests need no round trip to an engine's /tokenize.

Traffic that gains from KV routing repeats its leading messages: a tenant's system prompt, a
few-shot preamble, the conversation so far. The blocks an engine can have cached are the ones
every such chat begins with; what follows the last message's content is new. So the gateway
learns, per leading part (the messages but the last, the last one's role, the tools, template
and template arguments, the model or adapter name), the token ids every chat with it begins
with, and routes such a chat on those alone.

How it learns: the second time a leading part is seen, the engine tokenizes the whole prompt
and, at once, the same chat with the last message's content left empty. What the two begin
with in common is what the template renders before the content: the leading messages and the
last message's opening (for ChatML, `<|im_start|>user\\n`), or for a template that puts the
system prompt into the last user message (Mistral Instruct v0.3's), that opening with the
system prompt. Kept only when it is at least MIN_TOKENS long; a model whose templates fell
short MISMATCHES_OFF times is no longer learned (until the gateway restarts).

Checked as it is used: every SPOT_CHECK_EVERY-th chat answered from what was learned also asks
the engine for its whole prompt, aside (gateway/tokenize.py), and a learned part the whole prompt
does not begin with is dropped and counted as a mismatch. What the check cannot promise: a chat
whose content happens to begin like the empty content's rendering (a question starting with
the template's closing text) once taught more than the others share; the spot checks find it.

Learning costs the engine a second tokenization, so a part is learned the second time it is
seen, not the first: each turn of a conversation has leading messages never seen before (the
last turn's, plus the reply), and pays one /tokenize per request, as without this. The
exception is a chat that starts a prefix the gateway never sent anywhere (a new tenant's system
prompt): it asks no engine on its way, and its leading part is learned at once, aside
(gateway/tokenize.py), so the chats that follow it ask none either.

Bounded: at most MAX_TOKENS token ids in all (4 bytes each) and SEEN_KEYS keys of parts seen
once (about 100 bytes each), least recently used first out.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

# About 4 MB of token ids: 3,000 distinct leading parts of 330 tokens, or 30 of 33,000.
MAX_TOKENS = 1_000_000
# Leading parts remembered as seen once, by key.
SEEN_KEYS = 16_384
# Shorter than this in common is not worth keeping (a block is 16 tokens or more).
MIN_TOKENS = 16
# Template disagreements before a model's leading parts are no longer learned.
MISMATCHES_OFF = 3
# One chat in this many of those answered from what was learned is checked against the engine.
SPOT_CHECK_EVERY = 16
# For tokens_after: bytes of text to a token (English with common tokenizers), and the
# template's tokens after the content (its closing, the opening of the reply).
BYTES_PER_TOKEN = 4
TEMPLATE_TOKENS = 6
# Body fields that shape how the leading messages render, besides the messages themselves.
_SHAPING = ("tools", "chat_template", "chat_template_kwargs", "add_special_tokens")


def open_turn(body: Mapping[str, Any]) -> list[Any] | None:
    """A chat body's messages with the last one's content left empty, when there are leading
    messages and each is a message object."""
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    if not all(isinstance(m, Mapping) for m in messages):
        return None
    return [*messages[:-1], {"role": messages[-1].get("role"), "content": ""}]


def open_turn_fields(body: Mapping[str, Any], messages: list[Any]) -> dict[str, Any]:
    """The /tokenize chat body for `messages` (from open_turn): rendered as history, no opening
    for the assistant's reply."""
    fields: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for name in _SHAPING:
        if name in body:
            fields[name] = body[name]
    fields["add_generation_prompt"] = False
    return fields


def tokens_after(body: Mapping[str, Any]) -> int:
    """About how many tokens a chat has past what it begins with in common: its last content
    (a token to about 4 bytes of text, JSON for parts) and the template's few around it."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, Mapping) else None
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN) + TEMPLATE_TOKENS


def prefix_key(fields: Mapping[str, Any]) -> bytes | None:
    """What identifies a leading part: everything its rendering depends on (open_turn_fields);
    None for a body JSON cannot encode."""
    try:
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def common_start(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items (token ids, chained block hashes) `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PrefixTokens:
    def __init__(self, max_tokens: int = MAX_TOKENS, seen_keys: int = SEEN_KEYS) -> None:
        self._max_tokens = max_tokens
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._tokens = 0
        self._seen_keys = seen_keys
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._uses = 0
        # model -> how often what its template renders in common fell short or was wrong.
        # Keyed by the names of models with routes only (callers check), so it stays small.
        self._mismatches: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def learns(self, model: str) -> bool:
        """Whether this model's leading parts are learned (its template has not failed)."""
        return self._mismatches.get(model, 0) < MISMATCHES_OFF

    def get(self, key: bytes) -> tuple[int, ...] | None:
        ids = self._entries.get(key)
        if ids is None:
            return None
        self._entries.move_to_end(key)
        return tuple(ids)

    def spot_check_due(self) -> bool:
        """Counts one chat answered from what was learned; True for every SPOT_CHECK_EVERY-th,
        which should ask the engine for its whole prompt and `check` it."""
        self._uses += 1
        return self._uses % SPOT_CHECK_EVERY == 0

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
        self, model: str, key: bytes, opened: tuple[int, ...], whole: tuple[int, ...]
    ) -> bool:
        """Keep what `opened` (the chat with its last content empty) and `whole` (the chat, from
        the same engine) begin with in common, when that is at least MIN_TOKENS; else count a
        mismatch against the model. True when kept."""
        common = common_start(opened, whole)
        # `whole` must go on past it: a prompt's last token is always computed.
        if common < MIN_TOKENS or common >= len(whole):
            self._mismatch(model)
            return False
        return self._keep(key, whole[:common])

    def check(self, model: str, key: bytes, whole: tuple[int, ...]) -> bool:
        """A spot check: whether the whole prompt of a chat with this leading part begins with
        what was learned for it. If not, the part is dropped and a mismatch counted."""
        learned = self._entries.get(key)
        if learned is None:
            return True
        if len(whole) > len(learned) and tuple(learned) == whole[: len(learned)]:
            return True
        del self._entries[key]
        self._tokens -= len(learned)
        self._mismatch(model)
        return False

    def _mismatch(self, model: str) -> None:
        self._mismatches[model] = self._mismatches.get(model, 0) + 1

    def _keep(self, key: bytes, ids: tuple[int, ...]) -> bool:
        if len(ids) > self._max_tokens:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._tokens -= len(old)
        while self._entries and self._tokens + len(ids) > self._max_tokens:
            _, dropped = self._entries.popitem(last=False)
            self._tokens -= len(dropped)
        self._entries[key] = array("I", ids)
        self._tokens += len(ids)
        return True
