"""Requests in flight per replica: what least-loaded routing reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager


class InFlight:
    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    @property
    def counts(self) -> Mapping[str, int]:
        return self._counts

    def acquire(self, replica_id: str) -> None:
        self._counts[replica_id] = self._counts.get(replica_id, 0) + 1

    def release(self, replica_id: str) -> None:
        left = self._counts.get(replica_id, 0) - 1
        if left > 0:
            self._counts[replica_id] = left
        else:
            # Dropped at zero so replicas that went away do not linger.
            self._counts.pop(replica_id, None)

    @contextmanager
    def held(self, replica_id: str) -> Iterator[None]:
        self.acquire(replica_id)
        try:
            yield
        finally:
            self.release(replica_id)
