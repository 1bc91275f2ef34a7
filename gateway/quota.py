"""Per-key quotas checked on the request path: requests per minute, tokens per minute, and a
token budget per UTC day or calendar month.

Every method is synchronous. On one asyncio event loop a check-and-reserve with no await inside
cannot interleave with another, so two requests of one key can never both take the last of its
budget. A request reserves what it may use before it is sent and settles what it used when it
ends; the reservation keeps concurrent requests from spending the same tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, Protocol

WINDOW_S: Final = 60
SECONDS_PER_DAY: Final = 86_400
# When only in-flight reservations stand between a request and the budget, a retry succeeds as
# soon as they settle, which is usually seconds away: a short hint beats "come back tomorrow".
IN_FLIGHT_RETRY_S: Final = 1.0

DenialReason = Literal["rpm", "tpm", "budget"]


class LimitsLike(Protocol):
    """What the quota book reads from a key's limits; None means unlimited."""

    @property
    def rpm(self) -> int | None: ...
    @property
    def tpm(self) -> int | None: ...
    @property
    def token_budget(self) -> int | None: ...
    @property
    def budget_period(self) -> str: ...  # "day" or "month", in UTC


@dataclass(frozen=True, slots=True)
class Denied:
    reason: DenialReason
    message: str
    # Seconds until the same request would be admitted (round up for a Retry-After header);
    # None when waiting cannot help because the request alone is larger than the limit.
    retry_after_s: float | None


@dataclass(frozen=True, slots=True)
class BudgetBalance:
    budget: int
    spent: int
    reserved: int

    @property
    def left(self) -> int:
        return max(self.budget - self.spent - self.reserved, 0)


class Reservation:
    """What one admitted request holds until it is settled or released."""

    __slots__ = (
        "_budget_epoch",
        "_settled",
        "_state",
        "_tpm_second",
        "choices",
        "key_id",
        "max_tokens",
        "per_choice_tokens",
        "prompts",
        "tokens",
    )

    def __init__(
        self,
        key_id: str,
        tokens: int,
        state: _KeyState | None = None,
        tpm_second: int | None = None,
        budget_epoch: int | None = None,
    ) -> None:
        self.key_id = key_id
        self.tokens = tokens
        # The max_tokens to forward upstream, set by reserve_completion; None leaves the body as
        # the client sent it.
        self.max_tokens: int | None = None
        # What the request generates: `choices` completions in all (n, or best_of, times the
        # prompts of a /v1/completions array), from `prompts` prompts, each at most
        # `per_choice_tokens` long (None: not a completion). Settlement reads them to bill every
        # choice when an engine reports fewer (gateway/relay.py).
        self.choices = 1
        self.prompts = 1
        self.per_choice_tokens: int | None = None
        self._state = state
        self._tpm_second = tpm_second
        self._budget_epoch = budget_epoch
        self._settled = False

    @property
    def settled(self) -> bool:
        return self._settled


class _SlidingWindow:
    """Counts of the last 60 seconds in a ring of one bucket per second: adding and reading the
    total are O(1), and moving forward clears each passed second once, so O(1) amortised. A
    count leaves the window 59 to 60 seconds after it was made, depending on where in its
    second it fell: a second's precision is all a per-minute limit needs."""

    __slots__ = ("_buckets", "_second", "total")

    def __init__(self, second: int) -> None:
        self._buckets = [0] * WINDOW_S
        self._second = second
        self.total = 0

    def advance(self, second: int) -> None:
        passed = second - self._second
        if passed <= 0:
            return  # the same second, or a clock that stepped back: keep counting in the newest
        if passed >= WINDOW_S:
            self._buckets[:] = _ZEROS
            self.total = 0
        else:
            buckets = self._buckets
            for passed_second in range(self._second + 1, second + 1):
                index = passed_second % WINDOW_S
                self.total -= buckets[index]
                buckets[index] = 0
        self._second = second

    def add(self, amount: int) -> int:
        """Counts `amount` in the newest second and returns that second, for `adjust`."""
        self._buckets[self._second % WINDOW_S] += amount
        self.total += amount
        return self._second

    def adjust(self, second: int, amount: int) -> None:
        # A second that has left the window no longer counts, so neither does its correction.
        if self._second - WINDOW_S < second <= self._second:
            self._buckets[second % WINDOW_S] += amount
            self.total += amount

    def seconds_until_freed(self, amount: int, now: float) -> float:
        """Seconds until at least `amount` of the counts have left the window."""
        freed = 0
        for second in range(self._second - WINDOW_S + 1, self._second + 1):
            freed += self._buckets[second % WINDOW_S]
            if freed >= amount:
                return max(second + WINDOW_S - now, 0.0)
        return float(WINDOW_S)


_ZEROS: Final = (0,) * WINDOW_S


class _KeyState:
    __slots__ = ("epoch", "period_end", "period_start", "requests", "reserved", "spent", "tokens")

    def __init__(self) -> None:
        # Created on first use, so a key with only a budget carries no rings.
        self.requests: _SlidingWindow | None = None
        self.tokens: _SlidingWindow | None = None
        # Which budget period `spent` and `reserved` belong to; -inf until the first reserve
        # tells the period, and `epoch` changes whenever they are reset, so a reservation made
        # in an earlier period is not taken off the new one.
        self.period_start = -math.inf
        self.period_end = math.inf
        self.epoch = 0
        self.spent = 0
        self.reserved = 0


class QuotaBook:
    def __init__(self) -> None:
        # Only keys with limits, or with a loaded baseline, have an entry.
        self._keys: dict[str, _KeyState] = {}
        self._day: tuple[float, float] = (math.inf, -math.inf)
        self._month: tuple[float, float] = (math.inf, -math.inf)

    def __len__(self) -> int:
        """Keys with state: those with limits that have made requests, or a loaded baseline."""
        return len(self._keys)

    def reserve(
        self, key_id: str, limits: LimitsLike, estimate_tokens: int, now: float
    ) -> Reservation | Denied:
        """Admits a request expected to use up to `estimate_tokens`, or says which limit it hit.
        A denied request counts against nothing; an admitted one counts against rpm for good."""
        estimate = max(estimate_tokens, 0)
        rpm, tpm, budget = limits.rpm, limits.tpm, limits.token_budget
        if rpm is None and tpm is None and budget is None:
            return Reservation(key_id, estimate)
        state = self._keys.get(key_id)
        if state is None:
            state = self._keys[key_id] = _KeyState()
        second = int(now)
        # Every check runs before anything is counted, so a denial leaves no trace.
        requests = None
        if rpm is not None:
            requests = _advanced(state.requests, second)
            state.requests = requests
            if requests.total + 1 > rpm:
                return _rpm_denied(rpm, requests, now)
        tokens = None
        if tpm is not None:
            tokens = _advanced(state.tokens, second)
            state.tokens = tokens
            if tokens.total + estimate > tpm:
                return _tpm_denied(tpm, estimate, tokens, now)
        if budget is not None:
            period_end = self._roll_period(state, limits.budget_period, now)
            if state.spent + state.reserved + estimate > budget:
                return _budget_denied(
                    budget, limits.budget_period, estimate, state, period_end, now
                )
            state.reserved += estimate
        if requests is not None:
            requests.add(1)
        return Reservation(
            key_id,
            estimate,
            state,
            tokens.add(estimate) if tokens is not None else None,
            state.epoch if budget is not None else None,
        )

    def settle(self, reservation: Reservation, actual_tokens: int) -> int:
        """Replaces the reservation by what the request used. Only the first call counts.
        Returns the tokens used beyond a budget reservation (an engine that ignored max_tokens):
        they are still spent, because spend must equal usage, and the caller should log them."""
        if reservation._settled:
            return 0
        reservation._settled = True
        actual = max(actual_tokens, 0)
        state = reservation._state
        if state is None:
            return 0
        difference = actual - reservation.tokens
        if reservation._tpm_second is not None and state.tokens is not None:
            state.tokens.adjust(reservation._tpm_second, difference)
        if reservation._budget_epoch is None:
            return 0
        # A reservation from an earlier period was dropped with that period's counts; its usage
        # belongs to that period, which is over.
        if reservation._budget_epoch == state.epoch:
            state.reserved -= reservation.tokens
            state.spent += actual
        return max(difference, 0)

    def release(self, reservation: Reservation) -> None:
        """The request failed before using any token; it still counted as a request."""
        self.settle(reservation, 0)

    def completion_cap(
        self,
        key_id: str,
        limits: LimitsLike,
        prompt_estimate: int,
        requested_max_tokens: int | None,
        now: float,
        choices: int = 1,
    ) -> int | None:
        """The largest max_tokens that keeps prompt + completion within what is left of the
        budget (never more than the client asked for); None when the key has no budget.
        0 means there is no room for a completion. With several `choices` the engine applies
        max_tokens to each, so what is left is shared among them."""
        budget = limits.token_budget
        if budget is None:
            return None
        left = max(
            self._budget_left(key_id, budget, limits.budget_period, now) - prompt_estimate, 0
        )
        cap = left // max(choices, 1)
        if requested_max_tokens is not None:
            cap = min(cap, max(requested_max_tokens, 0))
        return cap

    def reserve_completion(
        self,
        key_id: str,
        limits: LimitsLike,
        prompt_estimate: int,
        requested_max_tokens: int | None,
        now: float,
        context_tokens: int | None = None,
        choices: int = 1,
    ) -> Reservation | Denied:
        """completion_cap and reserve in one step. The reservation's max_tokens is what the
        gateway must forward (None: leave the body as it is); with it, spend can never pass the
        budget. `context_tokens`, the model's context window, bounds any completion: without
        it a request that leaves max_tokens unset is sent the whole budget left as max_tokens,
        which engines such as vLLM refuse when it exceeds the context.

        `choices` is how many completions the request makes (n, best_of, prompts of an array):
        engines apply max_tokens to each one, so max_tokens stays a per-choice figure and the
        reservation holds it `choices` times."""
        prompt = max(prompt_estimate, 0)
        choices = max(choices, 1)
        # The most the engine could generate per choice if the budget were no object.
        ceiling = requested_max_tokens
        if context_tokens is not None:
            ceiling = context_tokens if ceiling is None else min(ceiling, context_tokens)
        cap = self.completion_cap(key_id, limits, prompt, ceiling, now, choices)
        if cap is None:
            result = self.reserve(key_id, limits, prompt + (ceiling or 0) * choices, now)
            if isinstance(result, Reservation):
                result.choices, result.per_choice_tokens = choices, ceiling
            return result
        # A budget cap can be far larger than a minute's tokens; without this a request that
        # leaves max_tokens unset would always be refused by tpm.
        tpm_room = self._tpm_room(key_id, limits.tpm, now)
        if tpm_room is not None and (tpm_room - prompt) // choices >= 1:
            cap = min(cap, (tpm_room - prompt) // choices)
        # When the budget leaves no room for a completion, asking for one token each is refused
        # with the right reason and retry_after.
        result = self.reserve(key_id, limits, prompt + max(cap, 1) * choices, now)
        if isinstance(result, Reservation):
            # The context already stops an engine short of the budget: nothing to clamp.
            unbounded = requested_max_tokens is None and cap == context_tokens
            result.max_tokens = None if unbounded else cap
            result.choices, result.per_choice_tokens = choices, max(cap, 1)
        return result

    def balance(self, key_id: str, limits: LimitsLike, now: float) -> BudgetBalance | None:
        """The key's budget in the current period; None when it has none."""
        budget = limits.token_budget
        if budget is None:
            return None
        state = self._keys.get(key_id)
        if state is None:
            return BudgetBalance(budget, 0, 0)
        self._roll_period(state, limits.budget_period, now)
        return BudgetBalance(budget, state.spent, state.reserved)

    def in_use(self, key_id: str, kind: str, now: float) -> int:
        """What the key has counted against one limit in this book: requests ("rpm") or tokens
        ("tpm") in the last 60 seconds, or budget tokens spent and reserved ("budget"). A
        gateway sharing limits with others holds at least this much of the key's lease."""
        state = self._keys.get(key_id)
        if state is None:
            return 0
        if kind == "budget":
            return state.spent + state.reserved
        window = state.requests if kind == "rpm" else state.tokens
        if window is None:
            return 0
        window.advance(int(now))
        return window.total

    def take_spent(self, key_id: str) -> int:
        """Hands over the budget tokens the key has spent in this book (to be reported to the
        store's shared pool) and stops counting them here; reservations stay."""
        state = self._keys.get(key_id)
        if state is None:
            return 0
        spent, state.spent = state.spent, 0
        return spent

    def forget(self, key_id: str) -> None:
        """Drops a revoked or deleted key; its reservations settle harmlessly afterwards."""
        self._keys.pop(key_id, None)

    def _budget_left(self, key_id: str, budget: int, period: str, now: float) -> int:
        state = self._keys.get(key_id)
        if state is None:
            return budget
        self._roll_period(state, period, now)
        return max(budget - state.spent - state.reserved, 0)

    def _tpm_room(self, key_id: str, tpm: int | None, now: float) -> int | None:
        if tpm is None:
            return None
        state = self._keys.get(key_id)
        if state is None or state.tokens is None:
            return tpm
        state.tokens.advance(int(now))
        return tpm - state.tokens.total

    def _roll_period(self, state: _KeyState, period: str, now: float) -> float:
        """Moves the key's budget counts into the period containing `now`; returns its end."""
        start, end = self._period_bounds(period, now)
        if state.period_start < start:
            _reset_period(state)
        # A baseline from a later period (this clock behind the store's) is kept: counting too
        # much is the safe side.
        state.period_start, state.period_end = start, end
        return end

    def _period_bounds(self, period: str, now: float) -> tuple[float, float]:
        # Cached, so a request costs two comparisons; recomputed once a period.
        if period == "day":
            if not self._day[0] <= now < self._day[1]:
                # Unix time has no leap seconds: every UTC day is exactly 86,400 of them.
                start = now - now % SECONDS_PER_DAY
                self._day = (start, start + SECONDS_PER_DAY)
            return self._day
        if period == "month":
            if not self._month[0] <= now < self._month[1]:
                self._month = _month_bounds(now)
            return self._month
        raise ValueError(f"budget_period must be 'day' or 'month', not {period!r}")


def _advanced(window: _SlidingWindow | None, second: int) -> _SlidingWindow:
    if window is None:
        return _SlidingWindow(second)
    window.advance(second)
    return window


def _reset_period(state: _KeyState) -> None:
    state.spent = 0
    state.reserved = 0
    state.epoch += 1
    state.period_end = math.inf


def _month_bounds(now: float) -> tuple[float, float]:
    today = datetime.fromtimestamp(now, UTC)
    start = datetime(today.year, today.month, 1, tzinfo=UTC)
    end = datetime(today.year + today.month // 12, today.month % 12 + 1, 1, tzinfo=UTC)
    return start.timestamp(), end.timestamp()


def _rpm_denied(rpm: int, requests: _SlidingWindow, now: float) -> Denied:
    if rpm <= 0:
        return Denied("rpm", "This key may not make requests (its rpm limit is 0).", None)
    retry = requests.seconds_until_freed(requests.total + 1 - rpm, now)
    return Denied("rpm", f"This key is limited to {rpm} requests per minute.", retry)


def _tpm_denied(tpm: int, estimate: int, tokens: _SlidingWindow, now: float) -> Denied:
    message = (
        f"This key is limited to {tpm} tokens per minute and this request may use up to {estimate}."
    )
    if estimate > tpm:
        return Denied("tpm", message + " Send a shorter prompt or a lower max_tokens.", None)
    return Denied("tpm", message, tokens.seconds_until_freed(tokens.total + estimate - tpm, now))


def _budget_denied(
    budget: int, period: str, estimate: int, state: _KeyState, period_end: float, now: float
) -> Denied:
    message = (
        f"This key has spent {state.spent} of its budget of {budget} tokens per {period} (UTC),"
        f" {state.reserved} more are held by requests in flight, and this request may use up"
        f" to {estimate}."
    )
    if estimate > budget:
        return Denied("budget", message, None)
    if state.spent + estimate <= budget:
        return Denied("budget", message, IN_FLIGHT_RETRY_S)
    return Denied("budget", message, period_end - now)
