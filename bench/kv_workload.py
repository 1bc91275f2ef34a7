"""The KV routing benchmark's workload (pure): tenant groups, each with a long system prompt of
its own shared by all its requests, interleaved as concurrent users send them. (The oracle pins
groups with bench/routing_workload.py's pinning_sessions.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Plain English words, about one SmolLM2 token each, for system prompts and questions.
_VOCABULARY = """
the customer account invoice refund policy order shipping delivery address payment card
bank transfer error message support ticket priority manager team weekly report summary
contract clause liability warranty product service subscription renewal cancel upgrade
downgrade discount coupon receipt tax region currency language tone polite brief formal
answer question explain reason example detail step first then finally always never must
"""
WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class Workload:
    groups: int = 8
    per_group: int = 6
    system_words: int = 250
    question_words: int = 10
    seed: int = 7


@dataclass(frozen=True)
class KvRequest:
    group: int
    messages: list[dict[str, str]]


def system_prompts(work: Workload) -> list[str]:
    """One per group: distinct from the first words on, so no two groups share a block."""
    rng = random.Random(work.seed)
    return [
        f"You are the assistant of tenant {group}. "
        + " ".join(rng.choices(WORDS, k=work.system_words))
        for group in range(work.groups)
    ]


def requests(work: Workload) -> list[KvRequest]:
    """`per_group` requests per group, each with a question of its own. Each round sends every
    group once, in an order shuffled per round: a replica sees its groups come back only after
    the others had their turn, which is when a small cache has evicted them."""
    systems = system_prompts(work)
    rng = random.Random(work.seed + 1)
    out: list[KvRequest] = []
    for turn in range(work.per_group):
        order = list(range(work.groups))
        rng.shuffle(order)
        for group in order:
            question = f"Question {turn}: " + " ".join(rng.choices(WORDS, k=work.question_words))
            messages = [
                {"role": "system", "content": systems[group]},
                {"role": "user", "content": question + "?"},
            ]
            out.append(KvRequest(group, messages))
    return out
