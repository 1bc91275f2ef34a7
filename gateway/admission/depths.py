"""How many requests each replica should hold at once: as many as its engine runs at a time,
learnt from the engine's own gauges, so that what waits waits in the gateway's fair queue and
not in the engine's arrival order.

Pure. Fed with each scrape of an engine's running and waiting counts (gateway/engine_scrape.py):
- an engine with requests waiting runs all it can: its running count is its depth (for
  llama.cpp its slots; for vLLM what its batch and KV cache take now);
- an engine running at least its depth with nothing waiting might take more, while the gateway
  holds requests back: the depth grows, doubling until the engine has first been seen with a
  queue, by one after that (the engine then settles one request above its true depth, which
  keeps its batch full between a request's end and the next one's arrival);
- a replica not yet sampled starts at FIRST_DEPTH: a gateway that has just started, or a
  replica that has just become ready, would otherwise fill the engine's own queue with a flood
  for up to a scrape period (a second by default), and that queue is served in arrival order;
- an engine whose metrics have no request gauges, and an external endpoint, are never sampled:
  they are held only to the gateway's `max_inflight_per_replica`.

A llama.cpp replica's route says how many slots it has (Route.slots, its -np): that is its
depth, with nothing to learn and no probe above it, since the engine never runs more. A request
sent past it would wait in the engine's own queue, in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where a replica starts until its gauges speak. Small on purpose: a flood on a fresh gateway
# fills an engine's queue by at most this before then, and the depth doubles every scrape.
FIRST_DEPTH = 4


@dataclass
class _Depth:
    depth: int
    seen_queue: bool = False
    known: bool = False  # the engine's slots, from its route: never learnt over


class ReplicaDepths:
    def __init__(self, ceiling: int, first: int = FIRST_DEPTH) -> None:
        self.ceiling = ceiling
        self.first = min(first, ceiling)
        self._depths: dict[str, _Depth] = {}

    def depth(self, replica_id: str, slots: int | None = None, gauged: bool = True) -> int:
        """The replica's depth; `slots`: its engine's, where its route says (Route.slots).
        `gauged`: its engine is scraped (not an external endpoint)."""
        if slots is not None:
            depth = min(slots, self.ceiling)
            current = self._depths.get(replica_id)
            if current is None or not current.known or current.depth != depth:
                self._depths[replica_id] = _Depth(depth, known=True)
            return depth
        known = self._depths.get(replica_id)
        if known is None:
            return self.first if gauged else self.ceiling
        return known.depth

    def ungauged(self, replica_id: str) -> None:
        """The engine answered its metrics without request gauges: nothing will be learnt, so
        it is held only to the ceiling (until gauges appear, which it then learns from)."""
        known = self._depths.get(replica_id)
        if known is None or not known.known:
            self._depths[replica_id] = _Depth(self.ceiling)

    def learnt(self) -> dict[str, int]:
        return {r: d.depth for r, d in self._depths.items()}

    def observe(self, replica_id: str, running: int, waiting: int, held_back: bool) -> None:
        """One sample of the engine's gauges. `held_back`: the gateway has requests for this
        replica's model waiting in its queue (only then is a depth too small worth growing)."""
        known = self._depths.setdefault(replica_id, _Depth(self.first))
        if known.known:
            return
        if waiting > 0:
            known.depth = max(1, min(running, self.ceiling))
            known.seen_queue = True
        elif held_back and running >= known.depth:
            grown = known.depth + 1 if known.seen_queue else known.depth * 2
            known.depth = min(grown, self.ceiling)

    def retain(self, replica_ids: set[str]) -> None:
        for replica_id in [r for r in self._depths if r not in replica_ids]:
            del self._depths[replica_id]
