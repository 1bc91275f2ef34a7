"""The KV routing benchmark's pure parts: its workload really is groups sharing long prefixes,
interleaved; its oracle really pins every request of a group to one replica through the
gateway's router; and its report's ratios and prediction error are what the figures say. The
benchmark itself (real vLLM replicas) is not part of the suite."""

from __future__ import annotations

import math
from collections import Counter

from bench.gateway.target import StaticRoutes
from bench.kv_report import ArmResult, Prediction, against_oracle, markdown, parse_prediction
from bench.kv_workload import Workload, requests, system_prompts
from bench.routing_workload import pinning_sessions
from gateway.routing import RequestKey, Router, RoutingSnapshot
from gateway.routing.request_key import prompt_bytes


def test_groups_share_a_long_system_prompt_and_are_interleaved() -> None:
    work = Workload(groups=5, per_group=4, system_words=200, seed=3)
    sent = requests(work)
    assert Counter(r.group for r in sent) == {g: 4 for g in range(5)}
    systems = system_prompts(work)
    assert len(set(systems)) == 5
    for request in sent:
        system, user = request.messages
        assert system == {"role": "system", "content": systems[request.group]}
        assert user["role"] == "user"
    # Several blocks of 32 tokens each (about a token a word), distinct from the first words.
    assert all(len(s.split()) > 200 for s in systems)
    assert len({s.split(".")[0] for s in systems}) == 5
    # Every round sends each group once, so a group comes back only after the others.
    for turn in range(4):
        assert sorted(r.group for r in sent[turn * 5 : (turn + 1) * 5]) == list(range(5))
    # Distinct questions, and the same seed gives the same workload.
    assert len({r.messages[1]["content"] for r in sent}) == len(sent)
    assert requests(work) == sent
    assert requests(Workload(groups=5, per_group=4, system_words=200, seed=4)) != sent


async def test_the_oracle_pins_every_request_of_a_group_to_replica_g_mod_n() -> None:
    """Through the router as the gateway runs it, on the workload's own chat bodies: the first
    request of each group by its session, every later one by the prefix it left there, even
    with the other groups' prefixes in the index."""
    upstreams = [f"http://127.0.0.1:{9000 + i}" for i in range(2)]
    table = await StaticRoutes(upstreams, model="m", engine="vllm", node="n").fetch()
    snapshot = RoutingSnapshot(table)
    ids = [route.replica_id for route in table.routes]
    work = Workload(groups=6, per_group=3, system_words=150)
    sessions = pinning_sessions(work.groups, ids)
    router = Router("prefix")
    reasons: Counter[str] = Counter()
    for request in requests(work):
        body = {"model": "m", "messages": request.messages}
        key = RequestKey("m", prompt_bytes(body), sessions[request.group])
        # Up to in-flight 3 the overload margin never overrides the pinning.
        decision = router.choose(snapshot, key, {ids[0]: 3})
        assert decision.route is not None
        assert decision.route.replica_id == ids[request.group % 2], request.group
        reasons[decision.reason] += 1
    assert reasons == {"session": 6, "prefix": 12}


def _arm(arm: str, ttft: list[float], prompt: int, cached: int) -> ArmResult:
    return ArmResult("small", arm, ttft_s=ttft, prompt_tokens=prompt, cached_tokens=cached)


def test_ratios_are_against_the_oracle_of_the_same_setting() -> None:
    oracle = _arm("oracle", [0.1, 0.2, 0.3], 300, 240)
    precise = _arm("precise", [0.1, 0.2, 0.45], 300, 236)
    other = ArmResult("default", "precise", ttft_s=[1.0], prompt_tokens=10, cached_tokens=5)
    ratios = against_oracle([precise, oracle, other])
    got = ratios[("small", "precise")]
    assert math.isclose(got.mean, 250 / 200)
    assert math.isclose(got.cached, (236 / 300) / (240 / 300))
    assert math.isclose(ratios[("small", "oracle")].mean, 1.0)
    # The mean's ratio comes with the interval this run's spread allows; the oracle needs none.
    assert got.mean_low < got.mean < got.mean_high
    assert math.isnan(ratios[("small", "oracle")].mean_low)
    assert f"| {got.mean_low:.2f}-{got.mean_high:.2f} |" in markdown([precise, oracle], "")
    # A setting without an oracle has no ratios rather than another setting's.
    assert math.isnan(ratios[("default", "precise")].mean)


def test_answers_added_by_workload_give_paired_intervals_from_six_workloads() -> None:
    oracle, precise = ArmResult("small", "oracle"), ArmResult("small", "precise")
    for seed in range(7, 13):
        for turn in range(4):
            oracle.add(seed, 0.2 + 0.1 * turn, 300, 200 if seed % 2 else 100)
            # Precise caches 10% less than the oracle on every workload, as fast.
            precise.add(seed, 0.2 + 0.1 * turn, 300, 180 if seed % 2 else 90)
    assert len(precise.ttft_s) == 24
    assert precise.prompt_tokens == 24 * 300
    got = against_oracle([precise, oracle])[("small", "precise")]
    assert math.isclose(got.cached, 0.9)
    assert math.isclose(got.cached_low, 0.9)
    assert math.isclose(got.cached_high, 0.9)
    assert math.isclose(got.mean_paired_low, 1.0)
    assert math.isclose(got.mean_paired_high, 1.0)
    assert "| 0.900 | 0.90-0.90 |" in markdown([precise, oracle], "")
    # Three workloads are too few to resample: the report says so rather than guess.
    short = ArmResult("small", "oracle")
    for seed in range(3):
        short.add(seed, 0.2, 300, 100)
    few = against_oracle([short, ArmResult("small", "precise", by_workload=short.by_workload)])
    assert math.isnan(few[("small", "precise")].cached_low)


METRICS = """
llmgw_kv_predicted_cached_tokens_error_bucket{le="-4096.0",model="m"} 0.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="-1024.0",model="m"} 0.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="-256.0",model="m"} 0.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="-64.0",model="m"} 0.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="-16.0",model="m"} 0.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="-1.0",model="m"} 2.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="0.0",model="m"} 9.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="16.0",model="m"} 9.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="64.0",model="m"} 10.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="256.0",model="m"} 10.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="1024.0",model="m"} 10.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="4096.0",model="m"} 10.0
llmgw_kv_predicted_cached_tokens_error_bucket{le="+Inf",model="m"} 10.0
llmgw_kv_predicted_cached_tokens_error_count{model="m"} 10.0
llmgw_kv_cached_tokens_total{kind="predicted",model="m"} 2016.0
llmgw_kv_cached_tokens_total{kind="reported",model="m"} 1984.0
"""


def test_the_prediction_error_comes_from_the_gateways_histogram() -> None:
    found = parse_prediction(METRICS)
    # 7 exact, 2 between -16 and -1, 1 between 16 and 64.
    assert found.by_bound == {0.0: 7.0, 16.0: 2.0, 64.0: 1.0}
    assert (found.requests, found.exact) == (10.0, 7.0)
    assert found.abs_error_bound == 2 * 16 + 64
    assert (found.predicted, found.reported) == (2016.0, 1984.0)
    arm = _arm("precise", [0.1] * 10, 3000, 1984)
    arm.prediction.add(found)
    arm.prediction.add(Prediction())  # a repeat without KV-routed requests changes nothing
    # At most 96 tokens off over 10 requests of 300 tokens: 3.2%; net +32 of 3000.
    assert math.isclose(arm.error_share, 96 / 10 / 300)
    assert math.isclose(arm.net_error_share, 32 / 3000)
    assert math.isnan(_arm("oracle", [0.1], 300, 0).error_share)
    # With the gateway's over and under totals the mean |error| is exact, not a bound.
    exact = parse_prediction(
        METRICS
        + 'llmgw_kv_cached_tokens_total{kind="over",model="m"} 48.0\n'
        + 'llmgw_kv_cached_tokens_total{kind="under",model="m"} 16.0\n'
    )
    assert (exact.over, exact.under) == (48.0, 16.0)
    exact_arm = _arm("precise", [0.1] * 10, 3000, 1984)
    exact_arm.prediction.add(exact)
    assert math.isclose(exact_arm.error_share, 64 / 10 / 300)
    table = markdown([arm], "header")
    assert "| small | precise | 10 | 0 |" in table
    assert "7 predicted exactly" in table
