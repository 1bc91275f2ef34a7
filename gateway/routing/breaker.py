"""A circuit breaker per replica: stop sending requests to a replica that keeps failing.

The routing table says a replica is READY until its node agent notices otherwise, which takes
seconds; meanwhile every request sent there fails. After `failures_to_open` consecutive failures
the replica is ejected for `open_s`; then it is half-open: exactly one request goes through as a
probe. The probe's success closes the breaker; its failure ejects the replica again for twice as
long (up to `max_open_s`), so a replica that stays broken costs one request per minute at most.

What counts as a failure is the caller's choice; the breaker only counts. The gateway counts a
refused connection, a timeout before the first byte, a 502, 503 or 504 (gateway/proxy.py), and
metrics that do not answer (gateway/engine_scrape.py). Times are the caller's clock
(time.monotonic), so the breaker is pure and tests drive time by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

# Told when this breaker opens a replica (its open period, seconds) or closes it (0): the other
# gateways then eject or readmit it too (gateway/peers/).
BreakerListener = Callable[[str, float], None]


class BreakerState(StrEnum):
    CLOSED = "closed"  # requests flow
    OPEN = "open"  # ejected until the open period ends
    HALF_OPEN = "half_open"  # the open period ended: one probe may go through


@dataclass
class _Trouble:
    """A replica with failures since its last success; replicas without one are closed."""

    consecutive_failures: int = 0
    opened_at: float | None = None  # None while still closed
    open_for_s: float = 0.0
    reopens: int = 0  # consecutive failed probes: each doubles the next open period
    probe_sent_at: float | None = None


class CircuitBreaker:
    def __init__(
        self,
        failures_to_open: int = 3,
        open_s: float = 5.0,
        max_open_s: float = 60.0,
        probe_timeout_s: float = 30.0,
    ) -> None:
        """`probe_timeout_s`: a probe that never reports back (its client left and nobody called
        succeeded or failed) stops blocking the next one after this long."""
        if failures_to_open < 1 or open_s <= 0 or max_open_s < open_s:
            raise ValueError("need failures_to_open >= 1 and 0 < open_s <= max_open_s")
        self.failures_to_open = failures_to_open
        self.open_s = open_s
        self.max_open_s = max_open_s
        self.probe_timeout_s = probe_timeout_s
        self._trouble: dict[str, _Trouble] = {}
        self.listener: BreakerListener | None = None

    def state(self, replica_id: str, now: float) -> BreakerState:
        trouble = self._trouble.get(replica_id)
        if trouble is None or trouble.opened_at is None:
            return BreakerState.CLOSED
        if now < trouble.opened_at + trouble.open_for_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allows(self, replica_id: str, now: float) -> bool:
        """Whether a request may go to the replica now. Changes nothing: the router asks about
        every candidate, and only the one it picks should spend a half-open replica's probe
        (`started`)."""
        trouble = self._trouble.get(replica_id)
        if trouble is None or trouble.opened_at is None:
            return True
        if now < trouble.opened_at + trouble.open_for_s:
            return False
        probe = trouble.probe_sent_at
        return probe is None or now - probe >= self.probe_timeout_s

    def started(self, replica_id: str, now: float) -> None:
        """A request was sent to the replica: when it is half-open, that request is the probe."""
        trouble = self._trouble.get(replica_id)
        if trouble is not None and self.state(replica_id, now) is BreakerState.HALF_OPEN:
            trouble.probe_sent_at = now

    def succeeded(self, replica_id: str, now: float) -> None:  # noqa: ARG002 - takes the clock as every event does
        """Any success closes the breaker and resets the backoff: the replica answered."""
        trouble = self._trouble.pop(replica_id, None)
        if trouble is not None and trouble.opened_at is not None and self.listener is not None:
            self.listener(replica_id, 0.0)

    def failed(self, replica_id: str, now: float) -> None:
        trouble = self._trouble.setdefault(replica_id, _Trouble())
        state = self.state(replica_id, now)
        if state is BreakerState.CLOSED:
            trouble.consecutive_failures += 1
            if trouble.consecutive_failures >= self.failures_to_open:
                self._open(replica_id, trouble, now)
        elif state is BreakerState.HALF_OPEN:
            trouble.reopens += 1
            self._open(replica_id, trouble, now)
        # While open: a request sent before the ejection failing late says nothing new, and
        # must not stretch the open period.

    def _open(self, replica_id: str, trouble: _Trouble, now: float) -> None:
        trouble.opened_at = now
        trouble.open_for_s = min(self.open_s * 2**trouble.reopens, self.max_open_s)
        trouble.probe_sent_at = None
        if self.listener is not None:
            self.listener(replica_id, trouble.open_for_s)

    def eject(self, replica_id: str, open_for_s: float, now: float) -> None:
        """Another gateway ejected the replica for `open_for_s` from now: so does this one,
        unless it has it open already (its own period stands). Told no listener."""
        trouble = self._trouble.setdefault(replica_id, _Trouble())
        if self.state(replica_id, now) is BreakerState.OPEN:
            return
        trouble.opened_at = now
        trouble.open_for_s = min(max(open_for_s, 0.0), self.max_open_s)
        trouble.probe_sent_at = None

    def readmit(self, replica_id: str) -> None:
        """Another gateway's probe succeeded: closed here too. Told no listener."""
        self._trouble.pop(replica_id, None)

    def open_now(self, now: float) -> list[tuple[str, float]]:
        """Replicas ejected now, with the seconds their open period has left."""
        return [
            (replica_id, t.opened_at + t.open_for_s - now)
            for replica_id, t in self._trouble.items()
            if t.opened_at is not None and now < t.opened_at + t.open_for_s
        ]

    def ejected_longest_ago(self, replica_ids: Iterable[str]) -> str | None:
        """Of these replicas, the one whose breaker opened first (None if none is open): the
        likeliest to have recovered."""
        oldest: tuple[float, str] | None = None
        for replica_id in replica_ids:
            trouble = self._trouble.get(replica_id)
            if trouble is None or trouble.opened_at is None:
                continue
            if oldest is None or trouble.opened_at < oldest[0]:
                oldest = (trouble.opened_at, replica_id)
        return None if oldest is None else oldest[1]

    def forget(self, replica_id: str) -> None:
        self._trouble.pop(replica_id, None)

    def known(self) -> set[str]:
        """Replicas with failures on record."""
        return set(self._trouble)
