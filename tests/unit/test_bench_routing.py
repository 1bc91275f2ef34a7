"""The routing benchmark's oracle arm pins groups through the gateway's own session hashing:
if that pinning were wrong, the arm would not be an oracle and every ratio to it would lie."""

from __future__ import annotations

import re

from bench.gateway.target import StaticRoutes
from bench.routing import BenchConfig, describe, pinning_sessions, workload
from gateway.routing import RequestKey, Router, RoutingSnapshot


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


def test_each_engines_line_shows_its_share_of_the_load_and_what_it_hit() -> None:
    # Two groups on the first engine, one each on the others; the third engine never hit.
    line = describe([(300.0, 100.0), (150.0, 50.0), (0.0, 200.0)])
    shares = re.findall(r"(\d+)% \(\s*(\d+)% cached\)", line)
    assert shares == [("50", "75"), ("25", "75"), ("25", "0")]
    # An engine that served nothing reads as 0%, not a division error.
    assert describe([(10.0, 10.0), (0.0, 0.0)]).endswith("  0% (  0% cached)")
