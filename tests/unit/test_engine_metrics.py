"""An engine's load from its own metrics: for the autoscaler and for a stop that drains."""

import asyncio

from aiohttp import web

from engines.metrics import (
    Load,
    in_flight,
    kv_cache_blocks,
    kv_usage,
    load,
    metrics_path,
    totals,
    wait_idle,
)

LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""
VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
"""


def test_in_flight_counts_running_and_queued_requests_per_engine() -> None:
    assert in_flight(LLAMACPP) == 3
    assert in_flight(VLLM) == 3  # KV use is not a request


def test_load_tells_running_from_waiting_and_sums_the_token_counters() -> None:
    assert load(LLAMACPP) == Load(running=2, waiting=1, work=1234.0)
    assert load(VLLM) == Load(running=3, waiting=0, work=0.0)


def test_kv_usage_is_the_fullest_rank_and_absent_for_llamacpp() -> None:
    two_ranks = VLLM + 'vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5\n'
    assert kv_usage(two_ranks) == 0.5
    assert kv_usage("sglang:token_usage 0.3\n") == 0.3
    assert kv_usage("trtllm_kv_cache_utilization 0.9\n") == 0.9
    assert kv_usage(LLAMACPP) is None


def test_totals_sum_named_counters_over_labels() -> None:
    text = LLAMACPP + "llamacpp:prompt_tokens_cached_total 600\n"
    assert totals(
        text, ["llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"]
    ) == {
        "llamacpp:prompt_tokens_total": 1234.0,
        "llamacpp:prompt_tokens_cached_total": 600.0,
    }
    assert totals("", ["x_total"]) == {"x_total": 0.0}


def test_tensorrt_llm_serves_metrics_on_its_own_path() -> None:
    assert metrics_path("trtllm") == "/prometheus/metrics"
    assert metrics_path("vllm") == metrics_path("llamacpp") == "/metrics"


def test_an_engine_without_in_flight_metrics_says_nothing() -> None:
    assert (
        in_flight("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 4\n") is None
    )
    assert in_flight("") is None


async def test_wait_idle_returns_once_requests_finish_and_sends_the_engine_key() -> None:
    busy = {"count": 3}
    keys: list[str] = []

    async def metrics(request: web.Request) -> web.Response:
        keys.append(request.headers.get("Authorization", ""))
        busy["count"] = max(0, busy["count"] - 1)  # one request finishes per look
        return web.Response(text=f"llamacpp:requests_processing {busy['count']}\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        outcome = await wait_idle(f"http://127.0.0.1:{port}/metrics", "k-1", 10, poll_s=0.01)
        busy["count"] = 99  # never finishes
        slow = await wait_idle(f"http://127.0.0.1:{port}/metrics", "k-1", 0.2, poll_s=0.01)
    finally:
        await runner.cleanup()
    assert outcome == "idle"
    assert set(keys) == {"Bearer k-1"}
    assert slow.startswith("still busy after")


async def test_an_engine_that_does_not_answer_is_stopped_without_waiting() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome = await wait_idle("http://127.0.0.1:9/metrics", "k", 30)
    assert outcome.startswith("no metrics")
    assert loop.time() - started < 5


def test_a_vllm_cache_size_is_read_from_its_cache_config_labels() -> None:
    # As vLLM 0.32 exports it: every CacheConfig field a label, the override among them.
    page = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0",'
        'num_gpu_blocks="33",num_gpu_blocks_override="32",prefix_caching_hash_algo="sha256"} 1.0\n'
        "vllm:num_requests_running 0.0\n"
    )
    assert kv_cache_blocks(page) == 33
    assert kv_cache_blocks(page.replace('num_gpu_blocks="33"', 'num_gpu_blocks="None"')) is None
    assert kv_cache_blocks("vllm:num_requests_running 0.0\n") is None
