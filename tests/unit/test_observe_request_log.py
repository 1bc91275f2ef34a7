"""The request log without a server: bounded, newest first, each filter, and a prompt kept
only as text cut to its bound."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.observe.record import PROMPT_CHARS, RequestRecord, new_request_id, prompt_text
from gateway.observe.request_log import BadFilter, RequestFilter, RequestLog


def record(n: int, **fields: object) -> RequestRecord:
    r = RequestRecord("/v1/chat/completions")
    r.model, r.key_id, r.key_name, r.replica, r.status = "m", "key_1", "alice", "m-0", 200
    for name, value in {"total_s": float(n), **fields}.items():
        setattr(r, name, value)
    return r


def test_the_log_holds_the_last_n_newest_first() -> None:
    log = RequestLog(3)
    records = [record(i) for i in range(5)]
    for r in records:
        log.add(r)
    assert len(log) == 3
    assert log.query(RequestFilter(), 10) == records[:1:-1]
    assert log.query(RequestFilter(), 1) == [records[4]]
    with pytest.raises(ValueError, match="at least one"):
        RequestLog(0)


def test_each_filter_narrows_the_log() -> None:
    log = RequestLog(100)
    fast = record(1, ttft_s=0.05)
    slow = record(2, ttft_s=2.0, replica="m-1")
    refused = record(3, status=429, key_id="key_2", key_name="bob", model="n")
    plain = record(4)  # no stream, no TTFT
    for r in (fast, slow, refused, plain):
        log.add(r)

    def pick(**wanted: Any) -> list[RequestRecord]:
        return log.query(RequestFilter(**wanted), 100)

    assert pick(model="n") == [refused]
    assert pick(key="bob") == pick(key="key_2") == [refused]
    assert pick(status_class="4xx") == [refused]
    assert pick(status_class="2xx") == [plain, slow, fast]
    assert pick(replica="m-1") == [slow]
    assert pick(min_ttft_s=1.0) == [slow]
    assert pick(request_id=fast.request_id) == [fast]
    assert pick(model="m", min_ttft_s=0.0, replica="m-0") == [fast]
    assert log.seen() == (["m", "n"], ["alice", "bob"], ["m-0", "m-1"])
    with pytest.raises(BadFilter, match="status"):
        RequestFilter(status_class="2XX")
    with pytest.raises(BadFilter, match="min_ttft_ms"):
        RequestFilter(min_ttft_s=float("nan"))


def test_request_ids_are_unique_and_prompts_are_text_cut_to_their_bound() -> None:
    assert len({new_request_id() for _ in range(1000)}) == 1000
    assert prompt_text({"prompt": "x" * (PROMPT_CHARS + 10)}) == "x" * PROMPT_CHARS
    chat = prompt_text({"messages": [{"role": "user", "content": "otters"}]})
    assert '"content": "otters"' in chat
    assert prompt_text({"input": ["a", "b"]}) == '["a", "b"]'
    assert prompt_text({"model": "m"}) == ""
