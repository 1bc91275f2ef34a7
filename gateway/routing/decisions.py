"""What a routing decision is: why a replica was chosen (a Prometheus label), which policies
there are, the decision itself, the ticket of a request the router noted it sent, the margin past
which a replica counts as overloaded, and where the router tells the prefixes it sends. The
router that makes them is gateway/routing/policy.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from gateway.routing.kv_blocks import BlockIds
from gateway.routing.token_load import Pending
from workflows.contracts import Route

# Why a replica was chosen: a small fixed set, so each can be a Prometheus label value.
Reason = Literal[
    "kv_prefix",  # its engine reports holding the most leading blocks of the prompt
    "prefix",  # it holds the longest cached prefix of the prompt (the gateway's own record)
    "session",  # the client's session lives there (no prefix matched)
    "new_prefix",  # a prefix never sent: where the least distinct prompt was sent lately
    "least_load",  # nothing to prefer: the least loaded replica, ties in turn
    "round_robin",  # the round-robin baseline policy
    "fallback_overloaded",  # the preferred replica was overloaded: the least loaded instead
    "fallback_ejected",  # every candidate's breaker was open: the one ejected longest ago
    "none",  # no candidate: the model has no ready replica (or all were tried)
]
REASONS: tuple[Reason, ...] = get_args(Reason)

Policy = Literal["prefix", "least_load", "round_robin"]
POLICIES: tuple[Policy, ...] = get_args(Policy)


@dataclass(frozen=True, slots=True)
class Decision:
    route: Route | None
    reason: Reason
    # Leading prompt blocks the chosen replica was last known to hold: its engine's blocks
    # (block_size tokens each) when it reported any match ("kv_prefix", or a fallback from it),
    # else the prefix index's 256-byte blocks.
    matched_blocks: int = 0
    # Prompt tokens the chosen engine should find in its cache, from its reported blocks: what
    # its `usage.prompt_tokens_details.cached_tokens` is compared with. 0 without token ids.
    predicted_cached_tokens: int = 0
    # The prompt's block ids as the chosen engine hashes them, as far as the decision hashed
    # them: handed to `sent`, which reads on from there. None unless it publishes KV events.
    kv_blocks: BlockIds | None = None
    # The prompt's chained 256-byte block hashes (prefix_index.py), as the "prefix" policy
    # hashed them: handed to `sent` for the slot replay. Empty under the other policies.
    prompt_keys: Sequence[int] = ()
    # Under a TTFT target: the prompt tokens the chosen replica should have to prefill, handed
    # to `sent` for its pending load. None: not worked out (the whole prompt counts).
    uncached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Sent:
    """A request as the router noted it sent (`Router.sent`), for `started` and `finished`."""

    replica_id: str
    kv: int | None = None  # its ticket in kv_pressure.py, where the engine publishes KV events
    slot: int | None = None  # its ticket in slot_cache.py, where the cache is the slots
    tokens: Pending | None = None  # its ticket in token_load.py, under a TTFT target


@dataclass(frozen=True, slots=True)
class OverloadMargin:
    """A replica is overloaded when its load exceeds the least loaded candidate's by more than
    `absolute` requests and by more than `factor` times: with the defaults, 5 against 0 or 1, 9
    against 4, 21 against 10. A cache hit saves one prefill; a queue of several requests costs
    several, so past this margin the cache is not worth the wait."""

    absolute: int = 4
    factor: float = 2.0

    def exceeded(self, load: int, least: int) -> bool:
        return load > max(least + self.absolute, least * self.factor)


class PrefixOutbox(Protocol):
    """Where the router tells the prefixes it sends (gateway/peers/outbox.py)."""

    def prefix_sent(self, replica_id: str, keys: Sequence[int]) -> None: ...
