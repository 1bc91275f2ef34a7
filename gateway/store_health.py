"""Whether the gateway can reach its store, and for how long it has not: the shared limits'
rounds report here, the request path reads it, and /metrics shows it."""

from __future__ import annotations

import time


class StoreHealth:
    def __init__(self, grace_s: float) -> None:
        # How long a gateway that lost its store keeps serving the keys it knows.
        self.grace_s = grace_s
        # time.time() of the last call that succeeded before the current outage; None when
        # the store answers.
        self._failing_since: float | None = None
        self._last_success: float | None = None
        self.refusals = 0  # requests refused for want of the store

    def succeeded(self, now: float) -> None:
        self._failing_since = None
        self._last_success = now

    def failed(self, now: float) -> None:
        # The outage began after the last call that worked, not when a call gave up on it.
        if self._failing_since is None:
            self._failing_since = self._last_success if self._last_success is not None else now

    def refused(self) -> None:
        self.refusals += 1

    @property
    def reachable(self) -> bool:
        return self._failing_since is None

    def down_for(self, now: float | None = None) -> float:
        """Seconds since the last call that worked, during an outage; 0 when reachable."""
        if self._failing_since is None:
            return 0.0
        return max((time.time() if now is None else now) - self._failing_since, 0.0)
