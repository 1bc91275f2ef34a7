"""The routing benchmark's configuration and workload (pure, no I/O): the engine settings and
arms it knows, how each arm's gateway routes (`gateway_routing`), `BenchConfig`, the requests a
seed draws (`workload`: groups of requests sharing a long system prompt, interleaved as
concurrent users send them), and the oracle's pinning of each group to a replica through the
gateway's own session hashing (`pinning_sessions`). bench/routing_arms.py runs it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.routing import affinity

# Engine flags per setting, on top of the common ones.
SETTINGS: dict[str, tuple[str, ...]] = {
    "default cache": (),
    "small cache": ("--cache-ram", "0"),
}
ARMS = ("llmgw", "round_robin", "oracle", "oracle_direct")
# The sticky arm's TTFT target unless --ttft-target-s: the one docs/sticky-routing.md argues
# for, named here so that the arm stays sticky while the setting's default is 0.
STICKY_TTFT_TARGET_S = 1.0
# The gateway's routing policy for each arm that goes through it, and its TTFT target for sticky
# routing (None: the setting's default; `sticky` takes --ttft-target-s where given).
GATEWAY_POLICY: dict[str, tuple[str, float | None]] = {
    "llmgw": ("prefix", None),
    "round_robin": ("round_robin", None),
    "oracle": ("prefix", None),
    "sticky": ("prefix", STICKY_TTFT_TARGET_S),
    "today": ("prefix", 0.0),
    "least_load": ("least_load", None),
}
ALL_ARMS = (*GATEWAY_POLICY, "oracle_direct")
# Words to build system prompts from: plain English, about one token a word for SmolLM2.
_VOCABULARY = """
the customer account invoice refund policy order shipping delivery address payment card
bank transfer error message support ticket priority manager team weekly report summary
contract clause liability warranty product service subscription renewal cancel upgrade
downgrade discount coupon receipt tax region currency language tone polite brief formal
answer question explain reason example detail step first then finally always never must
"""
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class BenchConfig:
    replicas: int = 3
    groups: int = 4
    per_group: int = 6
    in_flight: int = 3
    system_words: int = 150
    max_tokens: int = 4
    parallel: int = 2
    context: int = 4096
    threads: int = 1
    seed: int = 7
    # Runs of every arm, each on the workload of its own seed (seed, seed + 1, ...), summed: one
    # run of the small-cache setting can swing an arm's cached share by a third (the same
    # pinning gave 61% and 76% in one run), so compare a few.
    repeats: int = 1
    arms: tuple[str, ...] = ARMS
    # The first `hot_groups` groups get `hot_weight` requests a turn, the others one.
    hot_groups: int = 0
    hot_weight: int = 1
    fair_queue: bool = True
    ttft_target_s: float | None = None  # the sticky arm's; None: STICKY_TTFT_TARGET_S
    # Gateway processes on one store, each request to the next in turn (a load balancer's way);
    # they share their routing records over the peer bus (docs/peer-bus.md).
    gateways: int = 1
    settings: tuple[str, ...] = tuple(SETTINGS)


@dataclass(frozen=True)
class BenchRequest:
    group: int
    messages: list[dict[str, str]]


def workload(cfg: BenchConfig) -> list[BenchRequest]:
    """`groups` system prompts; each group's requests add a short question of their own. The
    order interleaves the groups (shuffled each round) as concurrent users would; each turn
    has `hot_weight` requests of each of the first `hot_groups` groups, one of the others."""
    rng = random.Random(cfg.seed)
    systems = [
        f"You are assistant number {g}. " + " ".join(rng.choices(_WORDS, k=cfg.system_words))
        for g in range(cfg.groups)
    ]
    requests: list[BenchRequest] = []
    for turn in range(cfg.per_group):
        order = list(range(cfg.groups))
        order += [g for g in range(min(cfg.hot_groups, cfg.groups))] * (cfg.hot_weight - 1)
        rng.shuffle(order)
        for group in order:
            question = f"Question {turn}: " + " ".join(rng.choices(_WORDS, k=8)) + "?"
            messages = [
                {"role": "system", "content": systems[group]},
                {"role": "user", "content": question},
            ]
            requests.append(BenchRequest(group, messages))
    return requests


def gateway_routing(cfg: BenchConfig, arm: str) -> tuple[str, float | None, bool] | None:
    """How the arm's gateway routes (policy, TTFT target, fair queue); None: no gateway."""
    if arm not in GATEWAY_POLICY:
        return None
    policy, target = GATEWAY_POLICY[arm]
    if arm == "sticky" and cfg.ttft_target_s is not None:
        target = cfg.ttft_target_s
    return policy, target, cfg.fair_queue


def seeds(first: int, repeats: int) -> str:
    """The workloads' seeds that `--seed first --repeats N` runs, as the header names them."""
    return f"seed {first}" if repeats <= 1 else f"seeds {first}-{first + repeats - 1}"


def pinning_sessions(groups: int, replica_ids: Sequence[str]) -> list[str]:
    """For each group g, a session name that the gateway's rendezvous hashing gives to replica
    g mod len(replica_ids): the oracle's pinning, expressed in a form the gateway honours."""
    sessions: list[str] = []
    for group in range(groups):
        wanted = group % len(replica_ids)
        session = next(
            name
            for name in (f"group-{group}-{n}" for n in itertools.count())
            if affinity.owner(name, replica_ids) == wanted
        )
        sessions.append(session)
    return sessions
