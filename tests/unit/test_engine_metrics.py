"""An engine's load from its own metrics: for the autoscaler and for a stop that drains."""

import asyncio

from aiohttp import web

from activities.engine_metrics import Load, in_flight, load, wait_idle

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


def test_in_flight_counts_running_and_queued_requests_per_engine():
    assert in_flight(LLAMACPP) == 3
    assert in_flight(VLLM) == 3  # KV use is not a request


def test_load_tells_running_from_waiting_and_sums_the_token_counters():
    assert load(LLAMACPP) == Load(running=2, waiting=1, work=1234.0)
    assert load(VLLM) == Load(running=3, waiting=0, work=0.0)


def test_an_engine_without_in_flight_metrics_says_nothing():
    assert (
        in_flight("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 4\n") is None
    )
    assert in_flight("") is None


async def test_wait_idle_returns_once_requests_finish_and_sends_the_engine_key():
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
    port = site._server.sockets[0].getsockname()[1]
    try:
        outcome = await wait_idle(f"http://127.0.0.1:{port}/metrics", "k-1", 10, poll_s=0.01)
        busy["count"] = 99  # never finishes
        slow = await wait_idle(f"http://127.0.0.1:{port}/metrics", "k-1", 0.2, poll_s=0.01)
    finally:
        await runner.cleanup()
    assert outcome == "idle"
    assert set(keys) == {"Bearer k-1"}
    assert slow.startswith("still busy after")


async def test_an_engine_that_does_not_answer_is_stopped_without_waiting():
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome = await wait_idle("http://127.0.0.1:9/metrics", "k", 30)
    assert outcome.startswith("no metrics")
    assert loop.time() - started < 5
