"""Server-sent events from an engine, split into events and filtered on the way to the client.

The gateway always asks the engine for the usage chunk (so every streamed request is accounted);
this is where usage is read from the stream and where that chunk is removed again when the client
did not ask for it. Events pass through byte for byte unless they have to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

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
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[5:].removeprefix(b" ") for line in lines)


def data_event(payload: dict[str, Any] | bytes) -> bytes:
    """One complete event (blank line included) carrying `payload`."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return b"data: " + data + b"\n\n"


@dataclass
class UsageFilter:
    """Reads usage out of chunks and decides what the client sees."""

    client_wants_usage: bool
    usage: dict[str, Any] | None = None
    saw_done: bool = False
    chunks: int = field(default=0)

    def process(self, event: bytes) -> bytes | None:
        """The event to send on (with its blank line), or None to drop it."""
        data = event_data(event)
        if data is None:
            return event + b"\n\n"
        if data.strip() == DONE:
            self.saw_done = True
            return event + b"\n\n"
        self.chunks += 1
        # Parsing every token's chunk would cost more than the relay itself: only chunks that
        # mention usage are looked into.
        if b'"usage"' not in data:
            return event + b"\n\n"
        try:
            chunk = json.loads(data)
        except ValueError:
            return event + b"\n\n"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("usage"), dict):
            return event + b"\n\n"
        self.usage = chunk["usage"]
        if self.client_wants_usage:
            return event + b"\n\n"
        if not chunk.get("choices"):
            return None  # the usage-only chunk the client did not ask for
        # Some engines put usage on the last content chunk: keep the content, drop the usage.
        del chunk["usage"]
        return data_event(chunk)


class StreamFilter:
    """Splitter and usage filter together, for the relay: most upstream chunks are whole
    events that carry no usage, and those pass through as they came, without being split."""

    def __init__(self, client_wants_usage: bool) -> None:
        self.splitter = SseSplitter()
        self.usage_filter = UsageFilter(client_wants_usage=client_wants_usage)

    def feed(self, chunk: bytes) -> bytes:
        """What to send on for this upstream chunk (possibly nothing)."""
        if self.splitter._buffer or not chunk.endswith(b"\n\n") or b"\r" in chunk:
            return self._carefully(chunk)  # an event spans chunks, or CRLF framing
        at = chunk.find(b'"usage"')
        if at < 0:
            return self._passed(chunk)
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
