"""Splitting an engine's SSE stream and filtering its usage chunk: pure, no sockets."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sse import EventTooLarge, SseSplitter, StreamFilter, UsageFilter, event_data

USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_events_split_across_arbitrary_chunk_boundaries_and_crlf() -> None:
    stream = b'data: {"a": 1}\r\n\r\n: keep-alive\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        splitter = SseSplitter()
        events = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert events == [b'data: {"a": 1}', b": keep-alive", b'data: {"b": 2}', b"data: [DONE]"]
        assert splitter.rest() == b""


def test_an_event_missing_its_blank_line_is_left_for_the_end() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b'data: {"a": 1}\n\ndata: {"par') == [b'data: {"a": 1}']
    assert splitter.rest() == b'data: {"par'


def test_a_runaway_event_is_refused() -> None:
    with pytest.raises(EventTooLarge):
        SseSplitter().feed(b"data: " + b"x" * (9 * 1024 * 1024))


def test_event_data_joins_data_lines() -> None:
    assert event_data(b"event: x\ndata: a\ndata:b") == b"a\nb"
    assert event_data(b": comment") is None
    # One line, the usual event: the space after the colon is dropped, only one.
    assert event_data(b"data: [DONE]") == b"[DONE]"
    assert event_data(b"data:  {}") == b" {}"
    assert event_data(b"event: x") is None


def test_usage_only_chunk_is_read_and_dropped_unless_asked_for() -> None:
    event = b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode()
    quiet = UsageFilter(client_wants_usage=False)
    assert quiet.process(event) is None
    assert quiet.usage == USAGE
    asked = UsageFilter(client_wants_usage=True)
    assert asked.process(event) == event + b"\n\n"
    assert asked.usage == USAGE


def test_usage_on_a_content_chunk_keeps_the_content() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "end"}}], "usage": USAGE}
    out = UsageFilter(client_wants_usage=False).process(b"data: " + json.dumps(chunk).encode())
    assert out is not None
    assert out.endswith(b"\n\n")
    relayed = json.loads(out.removeprefix(b"data: "))
    assert relayed == {"choices": [{"index": 0, "delta": {"content": "end"}}]}


def test_ordinary_chunks_pass_byte_for_byte_and_done_is_noticed() -> None:
    usage_filter = UsageFilter(client_wants_usage=False)
    event = b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}'
    assert usage_filter.process(event) == event + b"\n\n"
    assert usage_filter.process(b"data: [DONE]") == b"data: [DONE]\n\n"
    assert usage_filter.saw_done
    assert usage_filter.chunks == 1
    assert usage_filter.usage is None


# --- the relay's filter: whole usage-free chunks pass through without being split -----------

_STREAM = (
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"delta":{"content":"c"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)


def _relayed(cuts: list[int], wants_usage: bool) -> tuple[bytes, StreamFilter]:
    relay = StreamFilter(client_wants_usage=wants_usage)
    bounds = [0, *sorted(set(cuts)), len(_STREAM)]
    out = b"".join(relay.feed(_STREAM[a:b]) for a, b in itertools.pairwise(bounds))
    return out + relay.finish(), relay


@given(st.lists(st.integers(min_value=1, max_value=len(_STREAM) - 1), max_size=12), st.booleans())
def test_any_chunking_relays_the_same_events_and_usage(cuts: list[int], wants_usage: bool) -> None:
    careful = UsageFilter(client_wants_usage=wants_usage)
    whole = b"".join(
        kept for event in SseSplitter().feed(_STREAM) if (kept := careful.process(event))
    )
    out, relay = _relayed(cuts, wants_usage)
    assert out == whole
    assert relay.usage_filter.usage == {"prompt_tokens": 3, "completion_tokens": 3}
    assert relay.usage_filter.saw_done
    assert (b'"usage"' in out) is wants_usage, "the usage chunk only when the client asked"
    assert relay.usage_filter.chunks >= 3


def test_whole_event_chunks_pass_through_unchanged() -> None:
    relay = StreamFilter(client_wants_usage=False)
    first = _STREAM.split(b": keep")[0]
    assert relay.feed(first) == first
    assert relay.usage_filter.chunks == 2
