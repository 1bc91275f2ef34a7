"""How sure a routing decision was of the cache it aimed at: a state per decision, pure.

A decision's `reason` (policy.py) says why a replica was chosen; its state says how much the
gateway knew when it chose (docs/routing-states.md):

- exact: chosen from the engine's own KV events ("kv_prefix"), its feed live;
- approximate: chosen from the gateway's own record of what it sent where (the prefix tree, a
  llama.cpp replica's slots), a client's session, or where a new prefix should start;
- degraded: chosen without knowledge it should have had: the replica's engine publishes KV
  events but the gateway does not hear them now, or the picture other gateways share of what
  they sent where is incomplete;
- fallback: chosen by load alone: the policy is a load policy, the preferred replica was
  overloaded, every breaker was open, or a prompt matched nothing anywhere.

`StateBook` keeps, per model, the states of its recent decisions in a few time buckets, and
says when a model's routing changed state (with hysteresis: a new state must hold two thirds of
the recent decisions, and a model changes at most once per `hold_s`). It takes the time as an
argument, so it is tested by hand; the gateway logs what it returns.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from gateway.routing.decisions import Reason
from workflows.contracts import Route

RoutingState = Literal["exact", "approximate", "degraded", "fallback"]
STATES: tuple[RoutingState, ...] = get_args(RoutingState)

# Why a decision is in its state: a small fixed set, so each can be a Prometheus label value.
Why = Literal[
    "kv_events",  # exact: the engine's KV events, its feed live
    "sent_record",  # approximate: the gateway's record of the prompts it sent where
    "slot_record",  # approximate: what a llama.cpp replica's slots hold, by that record
    "session",  # approximate: the client's session (no prefix matched)
    "new_prefix",  # approximate: a prefix never sent, placed where the next ones will follow
    "feed_down",  # degraded: the engine publishes KV events; the gateway is not connected
    "no_snapshot",  # degraded: connected to its feed, which has not sent a whole snapshot yet
    "peers_missing",  # degraded: other gateways' record of what they sent is incomplete
    "overloaded",  # fallback: the preferred replica was overloaded
    "ejected",  # fallback: every candidate's breaker was open
    "policy",  # fallback: the routing policy is least_load or round_robin
    "no_match",  # fallback: no replica held any of the prompt, no session, no new prefix
    "no_replica",  # fallback: no candidate at all (never counted: nothing was sent)
]
WHYS: tuple[Why, ...] = get_args(Why)

# What the gateway knows of a replica's KV events: its feed (or publisher) is live; connected,
# its snapshot not complete yet; or not connected.
FeedState = Literal["live", "starting", "down"]

# An estimate for routes chosen by the gateway's own record: the prefix tree's blocks are 256
# bytes of prompt (prefix_index.py), about 64 tokens of English at 4 bytes a token.
PREFIX_BLOCK_BYTES = 256
TOKENS_PER_PREFIX_BLOCK = PREFIX_BLOCK_BYTES // 4

# A whole response's cached prompt tokens (usage.prompt_tokens_details.cached_tokens), and
# llama-server's in `timings` (cache_n), for a version whose usage has no details.
_CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_CACHE_N = re.compile(rb'"cache_n"\s*:\s*(\d+)')


@dataclass(frozen=True, slots=True)
class Routed:
    state: RoutingState
    why: Why


# What `classify` answers, made once: it runs for every request sent, and making a frozen
# dataclass costs about as much again as the classifying.
_NO_REPLICA = Routed("fallback", "no_replica")
_OVERLOADED = Routed("fallback", "overloaded")
_EJECTED = Routed("fallback", "ejected")
_POLICY = Routed("fallback", "policy")
_NO_SNAPSHOT = Routed("degraded", "no_snapshot")
_FEED_DOWN = Routed("degraded", "feed_down")
_KV_EVENTS = Routed("exact", "kv_events")
_PEERS_MISSING = Routed("degraded", "peers_missing")
_SLOT_RECORD = Routed("approximate", "slot_record")
_SENT_RECORD = Routed("approximate", "sent_record")
_SESSION = Routed("approximate", "session")
_NEW_PREFIX = Routed("approximate", "new_prefix")
_NO_MATCH = Routed("fallback", "no_match")


def classify(
    reason: Reason,
    route: Route | None,
    feed: FeedState | None = None,
    *,
    policy: str = "prefix",
    picture_complete: bool = True,
) -> Routed:
    """The state of a decision that chose `route` for `reason` under `policy`. `feed`: what
    the gateway hears of the route's KV events (None: nothing, as if down; read only for a
    route with `kv`). `picture_complete`: whether the record other gateways share of what they
    sent where is whole (False while a peer's is missing)."""
    if route is None or reason == "none":
        return _NO_REPLICA
    if reason == "fallback_overloaded":
        return _OVERLOADED
    if reason == "fallback_ejected":
        return _EJECTED
    if policy != "prefix" or reason == "round_robin":
        return _POLICY
    if route.kv is not None and feed != "live":
        # The engine's events would have said where the prompt is, or that it is nowhere.
        return _NO_SNAPSHOT if feed == "starting" else _FEED_DOWN
    if reason == "kv_prefix":
        # The engine's own events: what other gateways sent there is in them too.
        return _KV_EVENTS
    if not picture_complete:
        return _PEERS_MISSING
    if reason == "prefix":
        return _SLOT_RECORD if route.prompt_slots else _SENT_RECORD
    if reason == "session":
        return _SESSION
    if reason == "new_prefix":
        return _NEW_PREFIX
    return _NO_MATCH


def log_level(state: RoutingState, why: Why) -> int:
    """How loud a change into this state is: a warning where the gateway lacks knowledge or a
    replica's load or failures overrode the cache; information otherwise (a load policy, or
    prompts that share nothing, route by load as designed)."""
    if state == "degraded" or why in ("overloaded", "ejected"):
        return logging.WARNING
    return logging.INFO


@dataclass(frozen=True, slots=True)
class Expected:
    """What the chosen engine should report finding in its cache (usage.prompt_tokens_details
    .cached_tokens, or llama.cpp's timings.cache_n), for the incorrect-routing rate."""

    state: RoutingState
    tokens: int  # predicted (from KV events) or estimated (from the gateway's record)
    at_least: int  # fewer reported than this: the replica did not hold the prefix

    def incorrect(self, reported: int) -> bool:
        return reported < self.at_least


def expected_cache(state: RoutingState, kv_tokens: int, prefix_blocks: int) -> Expected | None:
    """What a decision predicted its replica holds: `kv_tokens` from its engine's KV events
    (Decision.predicted_cached_tokens), else `prefix_blocks` of the gateway's prefix tree or a
    slot (Decision.matched_blocks where Decision.kv_blocks is None). Incorrect when the engine
    reports fewer than half of it: a tail evicted still mostly hits, less than half means the
    premise failed. For the record's blocks the half is of 64 tokens a block (one token per 8
    bytes of prompt, well below any tokenizer's rate). None: nothing predicted."""
    if kv_tokens > 0:
        return Expected(state, kv_tokens, (kv_tokens + 1) // 2)
    if prefix_blocks > 0:
        tokens = prefix_blocks * TOKENS_PER_PREFIX_BLOCK
        return Expected(state, tokens, tokens // 2)
    return None


def reported_cached(raw: bytes) -> int | None:
    """A whole response's cached prompt tokens: its usage's, else llama-server's
    `timings.cache_n` (versions before their usage had details); None when it says neither."""
    usage_at = raw.rfind(b'"usage"')
    found = _CACHED_TOKENS.search(raw, usage_at) if usage_at >= 0 else None
    if found is None:
        timings_at = raw.rfind(b'"timings"')
        found = _CACHE_N.search(raw, timings_at) if timings_at >= 0 else None
    return int(found.group(1)) if found else None


@dataclass(frozen=True, slots=True)
class StateChange:
    """A model's routing moved from one state to another (from None: its first decisions)."""

    model: str
    before: RoutingState | None
    after: RoutingState
    why: Why
    count: int  # decisions in `after` in the recent window
    total: int  # decisions in the recent window
    window_s: float

    @property
    def level(self) -> int:
        return log_level(self.after, self.why)

    def message(self) -> str:
        moved = f"{self.before} -> {self.after}" if self.before else self.after
        return (
            f"routing of model {self.model}: {moved} ({self.why}; {self.count} of "
            f"{self.total} decisions in the last {self.window_s:g}s)"
        )


@dataclass
class _Bucket:
    index: int  # floor(time / bucket_s)
    decisions: Counter[tuple[RoutingState, Why]] = field(default_factory=Counter)
    predicted: Counter[RoutingState] = field(default_factory=Counter)
    incorrect: Counter[RoutingState] = field(default_factory=Counter)


@dataclass
class _Model:
    buckets: deque[_Bucket]
    shown: RoutingState | None = None  # the state last reported
    shown_why: Why | None = None
    changed_at: float | None = None
    # Since the gateway started, for the rate over a longer run than the window.
    predicted: Counter[RoutingState] = field(default_factory=Counter)
    incorrect: Counter[RoutingState] = field(default_factory=Counter)


class StateBook:
    """Per model, the states of its decisions and its cache checks in `buckets` buckets of
    `bucket_s` seconds (the window the console shows), and the state it is reported in: the
    state of at least `switch_share` of the decisions in the last `recent_buckets` buckets,
    changed at most once per `hold_s`. Memory: per model, `buckets` small counters."""

    def __init__(
        self,
        *,
        bucket_s: float = 10.0,
        buckets: int = 6,
        recent_buckets: int = 2,
        switch_share: float = 2 / 3,
        hold_s: float = 10.0,
    ) -> None:
        self.bucket_s = bucket_s
        self.buckets = buckets
        self.recent_buckets = min(recent_buckets, buckets)
        self.switch_share = switch_share
        self.hold_s = hold_s
        self._models: dict[str, _Model] = {}

    def note(self, model: str, routed: Routed, now: float) -> StateChange | None:
        """Count one decision; the change of the model's state it makes, if any."""
        entry = self._bucket(model, now)
        entry.decisions[routed.state, routed.why] += 1
        shown = self._models[model]
        if routed.state == shown.shown:
            return None  # a vote for the state shown moves no other past the threshold
        if shown.changed_at is not None and now - shown.changed_at < self.hold_s:
            return None
        recent = self._recent(shown, now)
        states: Counter[RoutingState] = Counter()
        for (state, _), n in recent.items():
            states[state] += n
        total = sum(states.values())
        leader, count = states.most_common(1)[0]
        if leader == shown.shown or count < self.switch_share * total:
            return None
        why = max((w for s, w in recent if s == leader), key=lambda w: recent[leader, w])
        change = StateChange(
            model, shown.shown, leader, why, count, total, self.recent_buckets * self.bucket_s
        )
        shown.shown, shown.shown_why, shown.changed_at = leader, why, now
        return change

    def checked(self, model: str, state: RoutingState, incorrect: bool, now: float) -> None:
        """A request whose decision predicted a cached prefix came back with the engine's
        figure: count it, and whether the engine held less than predicted (Expected)."""
        entry = self._bucket(model, now)
        totals = self._models[model]
        entry.predicted[state] += 1
        totals.predicted[state] += 1
        if incorrect:
            entry.incorrect[state] += 1
            totals.incorrect[state] += 1

    def view(self, now: float) -> list[dict[str, Any]]:
        """Per model: the state shown and since when, its decisions by state and why over the
        window, and its cache checks (over the window and since start). For the console."""
        window_s = self.buckets * self.bucket_s
        rows = []
        for model, entry in sorted(self._models.items()):
            live = self._live(entry, now)
            decisions: Counter[tuple[RoutingState, Why]] = Counter()
            predicted: Counter[RoutingState] = Counter()
            incorrect: Counter[RoutingState] = Counter()
            for bucket in live:
                decisions.update(bucket.decisions)
                predicted.update(bucket.predicted)
                incorrect.update(bucket.incorrect)
            by_state = {s: sum(n for (t, _), n in decisions.items() if t == s) for s in STATES}
            rows.append(
                {
                    "model": model,
                    "state": entry.shown,
                    "why": entry.shown_why,
                    "for_s": None if entry.changed_at is None else now - entry.changed_at,
                    "window_s": window_s,
                    "decisions": by_state,
                    "whys": [
                        {"state": s, "why": w, "count": n}
                        for (s, w), n in sorted(decisions.items())
                    ],
                    "predicted": _by_state(predicted),
                    "incorrect": _by_state(incorrect),
                    "incorrect_rate": _rate(incorrect, predicted),
                    "predicted_since_start": _by_state(entry.predicted),
                    "incorrect_since_start": _by_state(entry.incorrect),
                    "incorrect_rate_since_start": _rate(entry.incorrect, entry.predicted),
                }
            )
        return rows

    def _bucket(self, model: str, now: float) -> _Bucket:
        index = int(now // self.bucket_s)
        entry = self._models.get(model)
        if entry is None:
            entry = self._models[model] = _Model(deque(maxlen=self.buckets))
        buckets = entry.buckets
        if not buckets or buckets[-1].index < index:
            buckets.append(_Bucket(index))
        return buckets[-1]

    def _live(self, entry: _Model, now: float, count: int | None = None) -> list[_Bucket]:
        oldest = int(now // self.bucket_s) - (count or self.buckets) + 1
        return [b for b in entry.buckets if b.index >= oldest]

    def _recent(self, entry: _Model, now: float) -> Counter[tuple[RoutingState, Why]]:
        recent: Counter[tuple[RoutingState, Why]] = Counter()
        for bucket in self._live(entry, now, self.recent_buckets):
            recent.update(bucket.decisions)
        return recent


def _by_state(counts: Counter[RoutingState]) -> dict[str, int]:
    return {state: counts[state] for state in STATES}


def _rate(incorrect: Counter[RoutingState], predicted: Counter[RoutingState]) -> float | None:
    total = sum(predicted.values())
    return sum(incorrect.values()) / total if total else None
