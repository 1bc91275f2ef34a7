"""Whether the gateway can reach its store, and for how long it has not: the shared limits'
rounds report here, the request path reads it, and /metrics shows it."""

from __future__ import annotations

import time


class StoreHealth:
    def __init__(self, grace_s: float) -> None:
        # How long a gateway that lost its store keeps serving the keys it knows.
        self.grace_s = grace_s
        self._failing_since: float | None = None  # time.time() of the first failed call
        self.refusals = 0  # requests refused for want of the store

    def succeeded(self) -> None:
        self._failing_since = None

    def failed(self, now: float) -> None:
        if self._failing_since is None:
            self._failing_since = now

    def refused(self) -> None:
        self.refusals += 1

    @property
    def reachable(self) -> bool:
        return self._failing_since is None

    def down_for(self, now: float | None = None) -> float:
        """Seconds since the first failed call of the current outage; 0 when reachable."""
        if self._failing_since is None:
            return 0.0
        return max((time.time() if now is None else now) - self._failing_since, 0.0)
