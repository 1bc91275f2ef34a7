"""Server-sent events from an engine, split into events and filtered on the way to the client.

The gateway always asks the engine for the usage chunk (so every streamed request is accounted);
this is where usage is read from the stream and where that chunk is removed again when the client
did not ask for it. Events pass through byte for byte unless they have to change.

A request that generates several choices (n, best_of, an array of prompts) is also counted per
choice here: llama.cpp runs each choice as a task of its own and ends each with a usage chunk of
its own, and an engine may report fewer tokens than it streamed, so the relay bills the larger
of what the engine reported and what it saw (gateway/billing.py, `stream_counts`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

DONE = b"[DONE]"
# An event this large without its terminating blank line is not an engine talking.
MAX_EVENT_BYTES = 8 * 1024 * 1024


class EventTooLarge(ValueError):
    pass


class SseSplitter:
    """Feeds arbitrary byte chunks in, takes complete events (without their blank line) out."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk
        if b"\r" in buffer:
            # A CRLF split across two chunks rejoins here, since the whole buffer is rescanned.
            buffer = buffer.replace(b"\r\n", b"\n")
        events = buffer.split(b"\n\n")
        self._buffer = events.pop()
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise EventTooLarge(f"an event grew past {MAX_EVENT_BYTES} bytes")
        return [event for event in events if event.strip()]

    def rest(self) -> bytes:
        """What is left when the stream ends: an event missing its blank line, if any."""
        rest, self._buffer = self._buffer.strip(), b""
        return rest


def event_data(event: bytes) -> bytes | None:
    """The joined `data:` lines of one event, None when it has none (a comment, say)."""
    if b"\n" not in event:
        # One line, as an engine's events are: no list to build and join.
        return event[5:].removeprefix(b" ") if event.startswith(b"data:") else None
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[5:].removeprefix(b" ") for line in lines)


def data_event(payload: dict[str, Any] | bytes) -> bytes:
    """One complete event (blank line included) carrying `payload`."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return b"data: " + data + b"\n\n"


# The fields of a streamed choice that carry generated text: a chunk with one of them non-empty
# is (about) one token of that choice. Role-only and finish chunks carry none.
_TOKEN_FIELDS = ("text", "content", "reasoning_content", "reasoning", "refusal", "tool_calls")


@dataclass
class UsageFilter:
    """Reads usage out of chunks and decides what the client sees."""

    client_wants_usage: bool
    usage: dict[str, Any] | None = None
    saw_done: bool = False
    chunks: int = field(default=0)
    # Set for requests with several choices: every chunk is then parsed, to count the chunks
    # that carry text per choice index, and every final usage chunk is added up.
    count_choices: bool = False
    per_choice: dict[int, int] = field(default_factory=dict)
    final_usages: int = 0
    usage_prompt_sum: int = 0
    usage_prompt_max: int = 0
    usage_completion_sum: int = 0
    # With several choices: what the request is billed, from what was counted (set by the
    # relay: gateway/billing.py `stream_counts`). The engines' own usage chunks are then held
    # back, and the client gets one usage chunk saying what was billed, before [DONE], as
    # OpenAI sends one for all choices.
    billed: Callable[[UsageFilter], tuple[int, int] | None] | None = None
    _usage_chunk: dict[str, Any] | None = None

    def process(self, event: bytes) -> bytes | None:
        """The event to send on (with its blank line), or None to drop it."""
        data = event_data(event)
        if data is None:
            return event + b"\n\n"
        if data.strip() == DONE:
            self.saw_done = True
            return self._billed_usage() + event + b"\n\n"
        self.chunks += 1
        if self.count_choices:
            chunk = _json_object(data)
            if chunk is not None:
                self._count_choices(chunk)
        elif b'"usage"' in data:
            chunk = _json_object(data)
        else:
            # Parsing every token's chunk would cost more than the relay itself: for a single
            # choice only chunks that mention usage are looked into.
            return event + b"\n\n"
        if chunk is None or not isinstance(chunk.get("usage"), dict):
            return event + b"\n\n"
        self.usage = chunk["usage"]
        if self.count_choices:
            self._add_usage(chunk)
        if self.client_wants_usage and self.billed is None:
            return event + b"\n\n"
        if self.client_wants_usage:
            # Several choices: said once, as billed, before [DONE] (_billed_usage).
            self._usage_chunk = {**chunk, "choices": []}
        if not chunk.get("choices"):
            return None  # a usage-only chunk: not asked for, or said later as billed
        # Some engines put usage on the last content chunk: keep the content, drop the usage.
        del chunk["usage"]
        return data_event(chunk)

    def _billed_usage(self) -> bytes:
        """The one usage chunk a client that asked for usage gets for several choices: the
        last the engine sent, its counts replaced by what the request is billed."""
        chunk, self._usage_chunk = self._usage_chunk, None
        if chunk is None or self.billed is None:
            return b""
        counts = self.billed(self)
        if counts is not None:
            prompt, completion = counts
            usage = dict(chunk["usage"])
            usage.update(
                prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
            )
            chunk = {**chunk, "usage": usage}
        return data_event(chunk)

    def _count_choices(self, chunk: dict[str, Any]) -> None:
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            if not isinstance(index, int):
                continue
            delta = choice.get("delta")
            carrier = delta if isinstance(delta, dict) else choice
            if any(carrier.get(name) for name in _TOKEN_FIELDS):
                self.per_choice[index] = self.per_choice.get(index, 0) + 1

    def _add_usage(self, chunk: dict[str, Any]) -> None:
        """Adds up the usage that ends a choice: llama.cpp sends one such chunk per choice (a
        usage-only chunk in chat, usage on the finishing chunk in completions), vLLM and SGLang
        one for the whole request. Usage on a chunk that ends nothing is a running figure
        (vLLM's continuous_usage_stats) and is not added."""
        choices = chunk.get("choices")
        ends = not choices or (
            isinstance(choices, list)
            and all(isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)
        )
        usage = chunk["usage"]
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not ends or not isinstance(prompt, int):
            return
        self.final_usages += 1
        self.usage_prompt_sum += prompt
        self.usage_prompt_max = max(self.usage_prompt_max, prompt)
        self.usage_completion_sum += completion if isinstance(completion, int) else 0


def _json_object(data: bytes) -> dict[str, Any] | None:
    # orjson first (about a seventh of json's time on a usage chunk); json for what orjson
    # refuses (NaN, say), so no chunk json reads is dropped. orjson reads an integer past 64 bits
    # as a float, which no engine's token count or timestamp comes near.
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            chunk = json.loads(data)
        except ValueError:
            return None
    return chunk if isinstance(chunk, dict) else None


class StreamFilter:
    """Splitter and usage filter together, for the relay: most upstream chunks are whole
    events that carry no usage, and those pass through as they came, without being split."""

    def __init__(self, client_wants_usage: bool) -> None:
        self.splitter = SseSplitter()
        self.usage_filter = UsageFilter(client_wants_usage=client_wants_usage)

    def feed(self, chunk: bytes) -> bytes:
        """What to send on for this upstream chunk (possibly nothing)."""
        counted = self.usage_filter
        if counted.count_choices:
            return self._carefully(chunk)  # every event is looked into
        if self.splitter._buffer or not chunk.endswith(b"\n\n") or b"\r" in chunk:
            return self._carefully(chunk)  # an event spans chunks, or CRLF framing
        at = chunk.find(b'"usage"')
        if at < 0:
            # `_passed`, written out: nearly every chunk of a stream (a token's) ends here.
            done = chunk.endswith(b"data: [DONE]\n\n")
            counted.chunks += chunk.count(b"\n\n") - done
            if done:
                counted.saw_done = True
            return chunk
        # Only the event that mentions usage is looked into; the events around it pass as
        # they came (an engine often sends its last tokens, usage and [DONE] in one write).
        previous_end = chunk.rfind(b"\n\n", 0, at)
        start = previous_end + 2 if previous_end >= 0 else 0
        end = chunk.find(b"\n\n", at)
        kept = self.usage_filter.process(chunk[start:end])
        head = self._passed(chunk[:start]) if start else b""
        tail = self.feed(chunk[end + 2 :]) if end + 2 < len(chunk) else b""
        return head + (kept or b"") + tail

    def _passed(self, whole_events: bytes) -> bytes:
        """Whole events without usage: count them, notice [DONE], relay them unchanged."""
        done = whole_events.endswith(b"data: [DONE]\n\n")
        self.usage_filter.chunks += whole_events.count(b"\n\n") - done
        self.usage_filter.saw_done |= done
        return whole_events

    def _carefully(self, chunk: bytes) -> bytes:
        process = self.usage_filter.process
        return b"".join(
            kept for event in self.splitter.feed(chunk) if (kept := process(event)) is not None
        )

    def finish(self) -> bytes:
        """An event the stream ended without its blank line, if any."""
        rest = self.splitter.rest()
        kept = self.usage_filter.process(rest) if rest else None
        return kept or b""
