"""The hostile-client benchmark's own parts: bodies, labels, /proc/net/tcp reading, the
stand-in's request splitting and the report. No timing is asserted."""

from __future__ import annotations

import asyncio
import json
import math
import random

import pytest

from bench.abuse_bodies import (
    bad_key,
    big_body,
    good_body,
    prompt_array_body,
    prompts_for_bytes,
    request_bytes,
    slow_stream_body,
    spray_addresses,
    surrogate_bodies,
)
from bench.abuse_net import answer_label, paced, server_side_states
from bench.abuse_report import (
    ALL,
    QUIET,
    AbuseFigures,
    GoodFigures,
    Phase,
    format_counts,
    goal_lines,
    merge_counts,
    p99_ratio,
    report,
)
from bench.abuse_upstream import RequestSplitter, answer
from bench.gateway.loadgen import ResponseReader
from store.keyformat import parse_key_id

# --- bodies ----------------------------------------------------------------------------------


def test_prompt_array_body_is_that_many_one_token_prompts() -> None:
    body = prompt_array_body(20_000)
    parsed = json.loads(body)
    assert parsed["prompt"] == [[0]] * 20_000
    assert parsed["model"] == "mock"
    assert parsed["max_tokens"] == 1
    assert 80_000 <= len(body) <= 100_000  # the "about 100 KB"
    with pytest.raises(ValueError, match="at least one prompt"):
        prompt_array_body(0)


def test_prompts_for_bytes_sizes_the_multi_megabyte_body() -> None:
    body = prompt_array_body(prompts_for_bytes(4_000_000))
    assert abs(len(body) - 4_000_000) < 100
    assert prompts_for_bytes(1) == 1


def test_big_body_is_exactly_the_size_asked_and_valid_json() -> None:
    body = big_body(1_000_000)
    assert len(body) == 1_000_000
    content = json.loads(body)["messages"][0]["content"]
    assert content.startswith("lorem lorem")
    with pytest.raises(ValueError, match="a body needs at least"):
        big_body(10)


def test_surrogate_bodies_parse_to_text_that_is_not_utf8() -> None:
    found = 0
    for path, raw in surrogate_bodies(max_tokens=500):
        assert path in ("/v1/chat/completions", "/v1/completions")
        raw.decode("ascii")  # the bytes themselves are clean: only parsing makes surrogates
        body = json.loads(raw)
        assert body["max_tokens"] == 500
        text = json.dumps(body, ensure_ascii=False)
        with pytest.raises(UnicodeEncodeError):
            text.encode("utf-8")
        found += 1
    assert found == 4


def test_bad_keys_are_well_formed_and_differ() -> None:
    rng = random.Random(1)
    keys = {bad_key(rng) for _ in range(50)}
    assert len(keys) == 50
    assert all(parse_key_id(k) is not None for k in keys)


def test_spray_addresses_stay_in_their_block() -> None:
    addresses = spray_addresses(3)
    first = [next(addresses) for _ in range(300)]
    assert first[0] == "127.3.0.1"
    assert len(set(first)) == 300
    assert all(a.startswith("127.3.") and not a.endswith((".0", ".255")) for a in first)
    with pytest.raises(ValueError, match=r"block is 1\.\.255"):
        next(spray_addresses(0))


def test_request_bytes_carry_length_and_key() -> None:
    raw = request_bytes("/v1/completions", b'{"a":1}', "k", "h:1")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"Content-Length: 7" in head
    assert b"Authorization: Bearer k" in head
    assert body == b'{"a":1}'
    assert json.loads(good_body(True))["stream"] is True
    assert "stream" not in json.loads(good_body(False))
    assert json.loads(slow_stream_body(1000))["max_tokens"] == 1000


# --- network helpers -----------------------------------------------------------------------


def test_answer_label_names_the_error_code() -> None:
    assert answer_label(200, b"") == "200"
    body = b'{"error":{"message":"no","type":"invalid_request_error","code":"too_many_prompts"}}'
    assert answer_label(400, body) == "400 too_many_prompts"
    assert answer_label(500, b"Internal Server Error") == "500"


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1
   1: 0100007F:1F90 0400007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 2
   2: 0100007F:1F90 0400007F:C351 04 00400000:00000000 00:00000000 00000000  1000        0 3
   3: 0400007F:C350 0100007F:1F90 01 00000000:00001000 00:00000000 00000000  1000        0 4
"""


@pytest.mark.skipif(
    int.from_bytes(b"\x01\x00", "little") != 1, reason="the sample is little-endian"
)
def test_server_side_states_reads_the_gateways_end() -> None:
    clients = [("127.0.0.4", 0xC350), ("127.0.0.4", 0xC351), ("127.0.0.4", 0xC352)]
    states = server_side_states(PROC_NET_TCP, 0x1F90, clients)
    assert states == {
        ("127.0.0.4", 0xC350): "ESTABLISHED",  # the client's own end (line 3) is not it
        ("127.0.0.4", 0xC351): "FIN_WAIT1",
        ("127.0.0.4", 0xC352): "gone",
    }


async def test_paced_collects_every_label_and_reports_the_unanswered() -> None:
    async def send(i: int) -> list[str]:
        if i == 0:
            await asyncio.sleep(60)  # never answers within the drain
        return [f"ok{i % 2}"]

    labels = await paced(0.05, 200, 100, send, drain_s=0.05)
    assert labels.count("unanswered at end") == 1
    assert len(labels) >= 2
    assert set(labels) <= {"ok0", "ok1", "unanswered at end"}


# --- the stand-in ------------------------------------------------------------------------------


def test_request_splitter_finds_requests_across_any_split() -> None:
    raw = request_bytes("/v1/completions", prompt_array_body(3), "k", "h")
    two = raw + request_bytes("/v1/chat/completions", good_body(True), "k", "h")
    for size in (1, 7, 64, len(two)):
        splitter = RequestSplitter()
        got = []
        for i in range(0, len(two), size):
            got += splitter.feed(two[i : i + size])
        assert [h.split(b" ")[1] for h, _ in got] == [b"/v1/completions", b"/v1/chat/completions"]
        assert json.loads(got[0][1])["prompt"] == [[0], [0], [0]]


def _read(raw: bytes) -> ResponseReader:
    reader = ResponseReader()
    assert reader.feed(raw)
    return reader


def test_stand_in_answers_both_paths_and_long_streams() -> None:
    head = b"post /v1/chat/completions http/1.1\r\nhost: h"
    stream = answer(head, slow_stream_body(1000))
    assert _read(stream).saw_done
    assert len(stream) > 100_000  # one event a token
    assert _read(answer(head, good_body(False))).status == 200
    text = answer(b"post /v1/completions http/1.1", prompt_array_body(5))
    assert b'"text_completion"' in text
    assert _read(text).status == 200
    assert _read(answer(b"post /elsewhere http/1.1", b"")).status == 404


# --- the report --------------------------------------------------------------------------------


def _phase(name: str, latencies_ms: list[float], errors: int = 0) -> Phase:
    good = GoodFigures(
        sent=len(latencies_ms) + errors,
        errors=errors,
        latencies_s=[v / 1000 for v in latencies_ms],
        error_kinds={"timeout": errors} if errors else {},
    )
    return Phase(name, good, rss_start_mb=80.0, rss_peak_mb=120.0)


def test_format_and_merge_counts() -> None:
    assert format_counts({}) == "-"
    assert format_counts({"429": 40, "401": 1204, "400": 40}) == "401 x1,204, 400 x40, 429 x40"
    assert merge_counts({"a": 1}, {"a": 2, "b": 1}) == {"a": 3, "b": 1}


def test_p99_ratio_and_goals() -> None:
    quiet = _phase(QUIET, [10.0] * 100)
    fine = _phase("big", [12.0] * 100)
    slow = _phase("slow", [10.0] * 90 + [50.0] * 10)
    broken = _phase(ALL, [10.0] * 100, errors=1)
    assert p99_ratio(fine, quiet) == pytest.approx(1.2)
    assert p99_ratio(slow, quiet) == pytest.approx(5.0)
    assert p99_ratio(_phase("none", []), quiet) is None
    lines = goal_lines([quiet, fine, slow, broken])
    assert [line.split()[:2] for line in lines] == [
        ["big", "met"],
        ["slow", "MISSED"],
        ["all", "MISSED"],
    ]
    assert goal_lines([fine]) == ["no quiet phase: nothing to compare with"]


def test_report_puts_phases_and_answers_side_by_side() -> None:
    quiet = _phase(QUIET, [5.0] * 50)
    everything = _phase(ALL, [5.0] * 49 + [9.0], errors=2)
    everything.abuse = [AbuseFigures("bad keys", 10, {"401": 9, "429": 1}, "9 an address")]
    text = report([quiet, everything])
    assert "p99 / quiet" in text
    assert "401 x9, 429 x1 (9 an address)" in text
    assert "good-client errors in all: timeout x2" in text
    markdown = report([quiet, everything], markdown=True)
    assert "| all | 52 | 2 |" in markdown
    assert math.isnan(GoodFigures().p_ms(50))
