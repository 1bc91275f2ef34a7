"""Which replicas already hold as many requests from this gateway as it may send them, so the
gateway answers 429 `replicas_busy` rather than growing an engine's queue without bound. Pure:
the caller passes its in-flight counts (gateway/inflight.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workflows.contracts import Route


def full_replicas(routes: Iterable[Route], inflight: Mapping[str, int], limit: int) -> set[str]:
    """The ids among `routes` with `limit` or more requests in flight."""
    return {r.replica_id for r in routes if inflight.get(r.replica_id, 0) >= limit}
