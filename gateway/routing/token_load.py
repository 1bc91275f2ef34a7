"""Sticky until saturated: how much prompt each replica still has to prefill, how fast it
prefills, and the limit past which the replica holding a request's prefix is no longer worth
waiting for (the shape of llm-d's default scheduler: prefix affinity, then one calibrated
token-load limit). policy.py asks `first_within` of the holders in its order of preference,
and `quickest` of all candidates when none is within.

- **Pending tokens** of a replica: for each request this gateway sent there that has not started
  streaming back, its prompt tokens less those predicted cached there; plus the requests of
  other senders its engine's gauges show (`EngineLoadBoard.others`), each counted as the mean
  uncached prompt this gateway sent lately. A request sent without streaming counts until it
  finishes: nothing says when its prefill ended.
- **Prefill throughput** of a replica, in tokens a second: from each request that started, the
  tokens it waited for (its own uncached ones and those pending ahead of it when it was sent)
  over the time from its sending to its first byte. Smoothed as a ratio of two moving averages
  (tokens, seconds), so a sample weighs by its size; `default_tokens_per_s` before the first
  sample, never below `MIN_TOKENS_PER_S`. The time includes whatever else held the request up
  (a slot still decoding, the hop): a replica whose requests wait for slots reads as slower,
  so it is left sooner, which is what its TTFT asks for.
- **The limit**: throughput x `ttft_target_s`. Pending tokens divided by throughput is the
  time a request sent now waits for the prefills ahead of it, so a holder is chosen while its
  pending tokens plus this request's stay within the limit, or while it has none pending.
- **Past it** (`Judged.quickest`): the candidate whose pending tokens plus this request's
  uncached ones there, over its rate, take the least time, the holders included: a saturated
  holder stays where the others, prefilling the whole prompt, would be no sooner done.

Pure: the caller passes the clock's reading. Per decision: two dict reads per candidate.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gateway.routing.loads import EngineLoadBoard
from gateway.routing.prefix_index import BLOCK_BYTES
from gateway.routing.request_key import RequestKey

# English text runs at about four bytes a token in BPE tokenizers (gateway/prompt_estimate.py
# bounds from above with one a byte; an estimate of load wants the typical figure).
BYTES_PER_TOKEN = 4
# The prefix index's blocks (256 bytes) in tokens, at that rate.
TOKENS_PER_INDEX_BLOCK = BLOCK_BYTES // BYTES_PER_TOKEN
# The settings' default (gateway/settings.py): a 7-8B model on one recent GPU prefills ~10,000
# tokens a second, a CPU replica of a small one a few hundred. Only the first requests go by it.
DEFAULT_TOKENS_PER_S = 2000.0
# The floor: a replica that stalled for a minute must not read as so slow that every request
# holding its prefix leaves it for good; the next samples lift it again.
MIN_TOKENS_PER_S = 50.0
# A first byte sooner than this rate would say is not the prefill's (an event some proxy sends
# before the engine answers): no engine prefills one request's prompt this fast. Not taken.
MAX_TOKENS_PER_S = 500_000.0
# A sample of fewer tokens times the engine's fixed cost per request (the hop, one decode
# step), not its prefill: a fully cached prompt on an idle replica. Not taken.
MIN_SAMPLE_TOKENS = 64
# The newest sample's weight: about the last five requests decide.
SMOOTHING = 0.2


def prompt_tokens(request: RequestKey) -> int:
    """The request's prompt in tokens: its count where the gateway has one (the token ids'
    length, or the chat's leading ids and an estimate of the rest), else its routing prompt's
    bytes at BYTES_PER_TOKEN (cut at the index's 64 KB: a longer prompt reads as ~16k)."""
    if request.prompt_tokens > 0:
        return request.prompt_tokens
    if request.token_ids and not request.leading_only:
        return len(request.token_ids)
    return -(-len(request.prompt) // BYTES_PER_TOKEN)


@dataclass(slots=True, eq=False)
class _Replica:
    pending: int = 0  # this gateway's requests' tokens, sent and not started
    tokens: float = 0.0  # moving average of a sample's tokens (0: no sample yet)
    seconds: float = 0.0  # moving average of a sample's seconds


@dataclass(slots=True, eq=False)
class Pending:
    """A request counted at its replica until it starts or finishes (TokenLoad.sent)."""

    load: _Replica  # its replica's record when sent: one that left and came back is another
    tokens: int  # its uncached prompt tokens
    ahead: int  # the tokens pending there when it was sent, other senders' included
    sent_at: float
    open: bool = True


class TokenLoad:
    def __init__(
        self,
        ttft_target_s: float = 0.0,
        default_tokens_per_s: float = DEFAULT_TOKENS_PER_S,
        loads: EngineLoadBoard | None = None,
    ) -> None:
        """`ttft_target_s`: how long a request may wait for the prefills ahead of it on the
        replica holding its prefix; 0 leaves the holder's choice to OverloadMargin. `loads`:
        where other senders' requests show (the router's board)."""
        if ttft_target_s < 0 or default_tokens_per_s <= 0:
            raise ValueError("ttft_target_s must be at least 0, default_tokens_per_s above 0")
        self.ttft_target_s = ttft_target_s
        self.default_tokens_per_s = max(MIN_TOKENS_PER_S, default_tokens_per_s)
        self.loads = loads if loads is not None else EngineLoadBoard()
        self._replicas: dict[str, _Replica] = {}
        # The mean uncached prompt of the requests this gateway sent: what another sender's
        # request is taken to have left to prefill (0 until one is sent).
        self._mean_tokens = 0.0

    @property
    def enabled(self) -> bool:
        return self.ttft_target_s > 0

    def pending(self, replica_id: str, now: float) -> int:
        """Tokens waiting to be prefilled at the replica: this gateway's requests not started,
        plus other senders' requests (`EngineLoadBoard.others`: another gateway's, or a
        client's straight to the engine) at the mean uncached prompt this gateway sends. Neither
        the engine's gauges nor the peers' counts tell a request still prefilling from one
        decoding, so all of theirs count: an overestimate, until gateways share their
        pending tokens."""
        replica = self._replicas.get(replica_id)
        own = 0 if replica is None else replica.pending
        others = self.loads.others(replica_id, now)
        return own + round(others * self._mean_tokens) if others else own

    def tokens_per_s(self, replica_id: str) -> float:
        replica = self._replicas.get(replica_id)
        if replica is None or replica.seconds <= 0:
            return self.default_tokens_per_s
        return max(MIN_TOKENS_PER_S, replica.tokens / replica.seconds)

    def limit(self, replica_id: str) -> float:
        """The most pending tokens, this request's included, the replica takes while it holds
        the prompt's prefix."""
        return self.tokens_per_s(replica_id) * self.ttft_target_s

    def within(self, replica_id: str, pending: int, uncached: int) -> bool:
        """Whether the replica holding the prefix takes a request of `uncached` tokens with
        `pending` ahead of it: nothing is ahead, or the sum stays within its limit."""
        return pending == 0 or pending + uncached <= self.limit(replica_id)

    def judged(self, ids: Sequence[str], prompt: int, cached: Sequence[int], now: float) -> Judged:
        """One decision's figures: each candidate's pending tokens, and those of this request
        of `prompt` tokens there (`cached[i]` of them cached at candidate i)."""
        queued = [self.pending(replica_id, now) for replica_id in ids]
        work = [q + max(0, prompt - c) for q, c in zip(queued, cached, strict=True)]
        return Judged(self, ids, queued, work)

    def sent(
        self, replica_id: str, request: RequestKey, uncached: int | None, now: float
    ) -> Pending | None:
        """`request` was sent to the replica, `uncached` of its prompt tokens not in its cache
        (None: not worked out, all of them); its ticket for `started` and `finished`. None
        without a TTFT target."""
        if not self.enabled:
            return None
        tokens = prompt_tokens(request) if uncached is None else uncached
        ahead = self.pending(replica_id, now)
        replica = self._replicas.get(replica_id)
        if replica is None:
            replica = self._replicas[replica_id] = _Replica()
        replica.pending += tokens
        if self._mean_tokens <= 0:
            self._mean_tokens = float(tokens)
        else:
            self._mean_tokens += SMOOTHING * (tokens - self._mean_tokens)
        return Pending(replica, tokens, ahead, now)

    def started(self, ticket: Pending, now: float) -> None:
        """Its first bytes came back: its prefill is done, and it times the replica's."""
        if not ticket.open:
            return
        self._close(ticket)
        self._sample(ticket.load, ticket.ahead + ticket.tokens, now - ticket.sent_at)

    def finished(self, ticket: Pending) -> None:
        """It ended (after starting, or failed or cancelled before): no longer pending."""
        if ticket.open:
            self._close(ticket)

    def observed(self, replica_id: str, tokens: int, seconds: float) -> None:
        """The replica prefilled `tokens` (a request's uncached ones and those ahead of it) in
        `seconds` from the request's sending to its first byte."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            replica = self._replicas[replica_id] = _Replica()
        self._sample(replica, tokens, seconds)

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget replicas not in `replica_ids`: one that restarted comes back with a fresh
        record, and its old requests' tickets no longer count against it."""
        for replica_id in [r for r in self._replicas if r not in replica_ids]:
            del self._replicas[replica_id]

    @staticmethod
    def _close(ticket: Pending) -> None:
        ticket.open = False
        ticket.load.pending -= ticket.tokens

    @staticmethod
    def _sample(replica: _Replica, tokens: int, seconds: float) -> None:
        if tokens < MIN_SAMPLE_TOKENS or seconds * MAX_TOKENS_PER_S < tokens:
            return
        if replica.seconds <= 0:
            replica.tokens, replica.seconds = float(tokens), seconds
            return
        replica.tokens += SMOOTHING * (tokens - replica.tokens)
        replica.seconds += SMOOTHING * (seconds - replica.seconds)


class Judged:
    """The candidates of one decision as the TTFT target sees them (TokenLoad.judged)."""

    __slots__ = ("_ids", "_load", "_queued", "_work")

    def __init__(
        self, load: TokenLoad, ids: Sequence[str], queued: list[int], work: list[int]
    ) -> None:
        self._load, self._ids, self._queued, self._work = load, ids, queued, work

    def uncached(self, index: int) -> int:
        """The request's prompt tokens candidate `index` would have to prefill."""
        return self._work[index] - self._queued[index]

    def first_within(self, order: Sequence[int]) -> int | None:
        """The first candidate in `order` that takes the request within its limit."""
        within, ids, queued = self._load.within, self._ids, self._queued
        return next((i for i in order if within(ids[i], queued[i], self.uncached(i))), None)

    def quickest(self, loads: Sequence[int], start: int) -> int:
        """Every holder is past its limit: the least predicted wait for the first token, the
        tokens pending at a candidate plus those of this request it would prefill there over
        its rate, the holders included; then the fewest requests (`loads`); among equals the
        first at or after `start`. A holder past its limit is kept while every other replica,
        prefilling the whole prompt, would be no quicker; one that would be quicker gets the
        request and then holds the prefix too."""
        rate, ids, work = self._load.tokens_per_s, self._ids, self._work
        waits = [work[i] / rate(ids[i]) for i in range(len(ids))]
        count = len(waits)
        best = start % count
        for offset in range(1, count):
            index = (start + offset) % count
            if (waits[index], loads[index]) < (waits[best], loads[best]):
                best = index
        return best
