"""The routing benchmark's oracle arm pins groups through the gateway's own session hashing:
if that pinning were wrong, the arm would not be an oracle and every ratio to it would lie."""

from __future__ import annotations

import re
from collections import Counter

from bench.gateway.target import StaticRoutes
from bench.routing_gateway import gateway_settings
from bench.routing_report import describe
from bench.routing_workload import BenchConfig, gateway_routing, pinning_sessions, workload
from gateway.routing import RequestKey, Router, RoutingSnapshot
from gateway.settings import GatewaySettings


async def test_each_groups_session_lands_on_its_pinned_replica_through_the_router() -> None:
    upstreams = [f"http://127.0.0.1:{9000 + i}" for i in range(3)]
    table = await StaticRoutes(upstreams, model="m", engine="llamacpp", node="n").fetch()
    snapshot = RoutingSnapshot(table)
    ids = [route.replica_id for route in table.routes]
    sessions = pinning_sessions(5, ids)
    assert len(set(sessions)) == 5
    router = Router("prefix")
    for group, session in enumerate(sessions):
        # A prompt no replica has seen: only the session can decide.
        prompt = f"group {group} opening that nobody has sent before ".encode() * 20
        decision = router.choose(snapshot, RequestKey("m", prompt, session), {})
        assert decision.reason == "session"
        assert decision.route is not None
        assert decision.route.replica_id == ids[group % 3]
        # Its later requests find the prefix on the same replica.
        again = router.choose(snapshot, RequestKey("m", prompt + b"next question", session), {})
        assert again.reason == "prefix"
        assert again.route == decision.route


def test_the_workload_interleaves_groups_that_share_a_system_prompt() -> None:
    cfg = BenchConfig(groups=4, per_group=3, system_words=20)
    requests = workload(cfg)
    assert len(requests) == 12
    for turn in range(3):
        assert sorted(r.group for r in requests[turn * 4 : turn * 4 + 4]) == [0, 1, 2, 3]
    systems = {r.group: r.messages[0]["content"] for r in requests}
    assert all(r.messages[0]["content"] == systems[r.group] for r in requests)
    assert len(set(systems.values())) == 4


def test_hot_groups_get_their_weight_of_every_turn() -> None:
    cfg = BenchConfig(groups=3, per_group=2, system_words=20, hot_groups=1, hot_weight=3)
    requests = workload(cfg)
    assert len(requests) == 2 * 5
    for turn in range(2):
        assert Counter(r.group for r in requests[turn * 5 : turn * 5 + 5]) == {0: 3, 1: 1, 2: 1}


def test_the_arms_gateways_route_with_their_ttft_targets() -> None:
    cfg = BenchConfig(fair_queue=False, ttft_target_s=0.5)
    assert gateway_routing(cfg, "sticky") == ("prefix", 0.5, False)
    assert gateway_routing(cfg, "today") == ("prefix", 0.0, False)
    assert gateway_routing(cfg, "least_load") == ("least_load", None, False)
    assert gateway_routing(cfg, "oracle_direct") is None
    # Without --ttft-target-s the sticky arm is sticky whatever the setting's default.
    assert gateway_routing(BenchConfig(), "sticky") == ("prefix", 1.0, True)
    # The gateway process serves with the target in its settings (the app hands it to its
    # Router); none named, the setting's default.
    for target in (0.0, 0.25):
        settings = gateway_settings(1, "prefix", target, fair_queue=False)
        assert (settings.routing_ttft_target_s, settings.fair_queue) == (target, False)
    default = GatewaySettings().routing_ttft_target_s
    assert gateway_settings(1, "prefix", None, True).routing_ttft_target_s == default


def test_each_engines_line_shows_its_share_of_the_load_and_what_it_hit() -> None:
    # Two groups on the first engine, one each on the others; the third engine never hit.
    line = describe([(300.0, 100.0), (150.0, 50.0), (0.0, 200.0)])
    shares = re.findall(r"(\d+)% \(\s*(\d+)% cached\)", line)
    assert shares == [("50", "75"), ("25", "75"), ("25", "0")]
    # An engine that served nothing reads as 0%, not a division error.
    assert describe([(10.0, 10.0), (0.0, 0.0)]).endswith("  0% (  0% cached)")
