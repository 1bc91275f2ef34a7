"""Engine load samples: parsing each engine's metric names, freshness, concurrent scraping."""

from __future__ import annotations

import asyncio

import pytest

from gateway.routing.loads import (
    EngineLoadBoard,
    EngineUnreachable,
    LoadSample,
    NoMetricsPage,
    sample_from_metrics,
    scrape_all,
)
from workflows.contracts import ReplicaState, Route

# Shaped like each engine's /metrics page (names from ../shared/REFERENCE.md), with labels, help
# and type lines, and neighbouring metrics that must not be counted.
LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
llamacpp:prompt_tokens_cached_total 800
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""
VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 7.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
"""
SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 6.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 2.0
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.4
sglang:cache_hit_rate{model_name="qwen",tp_rank="0"} 0.9
"""
TRTLLM = """# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="llama"} 4
trtllm_num_requests_waiting{model_name="llama"} 1
trtllm_kv_cache_utilization{model_name="llama"} 0.5
"""


@pytest.mark.parametrize(
    ("text", "running", "waiting", "kv"),
    [
        (LLAMACPP, 2, 5, None),
        (VLLM, 4, 7, 0.75),
        (SGLANG, 6, 2, 0.4),
        (TRTLLM, 4, 1, 0.5),
    ],
    ids=["llamacpp", "vllm", "sglang", "trtllm"],
)
def test_each_engines_gauges_become_a_sample(
    text: str, running: int, waiting: int, kv: float | None
) -> None:
    assert sample_from_metrics(text, taken_at=7.0) == LoadSample(running, waiting, kv, 7.0)


def test_metrics_without_request_gauges_give_no_sample() -> None:
    assert sample_from_metrics("process_cpu_seconds_total 4\n", 0.0) is None
    assert sample_from_metrics("", 0.0) is None


def test_the_board_ignores_stale_samples_and_older_answers() -> None:
    board = EngineLoadBoard(max_age_s=5.0)
    board.record("r", LoadSample(1, 2, None, taken_at=10.0))
    assert board.others("r", now=15.0) == 3
    assert board.others("r", now=15.1) is None, "older than 5 s: not trusted"
    assert board.age_s("r", now=15.1) == pytest.approx(5.1)
    # A slow scrape that answers after a newer one must not win.
    board.record("r", LoadSample(9, 9, None, taken_at=12.0))
    board.record("r", LoadSample(0, 0, None, taken_at=11.0))
    assert board.others("r", now=12.0) == 18
    board.update({"s": LoadSample(1, 0, None, 12.0)})
    board.retain(["s"])
    assert board.latest("r", 12.0) is None
    assert board.others("r", 12.0) is None, "a replica that left has no load"
    assert board.others("s", 12.0) == 1
    # A round's `now` also clears samples of replicas no longer scraped, once too old.
    board.update({"t": LoadSample(0, 0, None, 30.0)}, now=30.0)
    assert board.age_s("s", 30.0) is None
    assert board.others("t", 30.0) == 0
    board.forget("t")
    assert board.others("t", 30.0) is None


def test_a_sample_counts_only_the_requests_this_gateway_did_not_send() -> None:
    # Read while this gateway had 3 of the engine's 5 requests there: 2 are someone else's.
    assert LoadSample(4, 1, None, 0.0, own=3).others == 2
    # A request just sent may not be in the engine's gauges yet: never below zero.
    assert LoadSample(1, 0, None, 0.0, own=2).others == 0
    board = EngineLoadBoard()
    board.record("r", LoadSample(2, 0, None, 10.0, own=2))
    assert board.others("r", now=10.5) == 0


def route(replica_id: str, engine: str = "llamacpp") -> Route:
    return Route(
        replica_id=replica_id,
        model="m",
        node="n",
        endpoint=f"http://127.0.0.1:1/{replica_id}",
        engine=engine,
        state=ReplicaState.READY,
    )


async def test_scrape_all_is_concurrent_and_reports_each_failure() -> None:
    both_started = asyncio.Event()
    started: set[str] = set()

    async def fetch(r: Route) -> str:
        started.add(r.replica_id)
        if r.replica_id == "hangs":
            await asyncio.sleep(3600)
        if r.replica_id == "refuses":
            raise ConnectionRefusedError("connection refused")
        if r.replica_id == "bare":
            return "# nothing useful\n"
        if r.replica_id == "no-page":
            raise NoMetricsPage("HTTP 501")
        if r.replica_id == "down":
            raise EngineUnreachable("ClientConnectorError: nothing listens")
        if {"slow-a", "slow-b"} <= started:
            both_started.set()
        # Each slow one waits for the other: only a concurrent scrape finishes.
        await asyncio.wait_for(both_started.wait(), timeout=5)
        return VLLM if r.replica_id == "slow-a" else TRTLLM

    routes = [route("slow-a", "vllm"), route("slow-b", "trtllm")]
    routes += [route("hangs"), route("refuses"), route("bare"), route("down"), route("no-page")]
    loop = asyncio.get_running_loop()
    began = loop.time()
    own = {"slow-a": 3}
    result = await scrape_all(routes, fetch, timeout_s=0.2, clock=lambda: 42.0, own=own)
    assert loop.time() - began < 2.0
    assert result == {
        "slow-a": LoadSample(4, 7, 0.75, 42.0, own=3),
        "slow-b": LoadSample(4, 1, 0.5, 42.0),
    }
    assert result.failures["hangs"] == "no answer within 0.2s"
    assert result.failures["refuses"] == "ConnectionRefusedError: connection refused"
    assert result.failures["bare"] == "no request gauges in its metrics"
    assert result.failures["down"] == "ClientConnectorError: nothing listens"
    # Only an engine that nothing answered for counts against its breaker: one late, without
    # gauges, or whose page errs is still answering requests.
    assert result.unreachable == {"down"}
    # Nothing to read and nothing a later scrape will change: the gate stops waiting to learn.
    assert result.failures["no-page"] == "HTTP 501"
    assert result.ungauged == {"bare", "no-page"}
