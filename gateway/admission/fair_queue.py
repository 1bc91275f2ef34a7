"""The requests of one model waiting for a replica with room, and the order they leave in.

Pure: the caller passes the clock. Three rules decide who goes next:
- Classes first: a higher priority class (PRIORITY_CLASSES, highest first) leaves before a lower
  one. So that a lower class is never starved for good, a lower-class request that has waited
  `aging_s` gets a share: every AGED_TURN-th request to leave while such requests wait is the
  longest-waiting of them. A share, not a promotion: aging a request up a class per span let a
  sustained batch flood, all of it waiting long, outrank every fresh interactive request.
- Within a class, fair among keys by tokens: start-time fair queuing. Each key has a virtual
  finish time that each of its requests advances by its cost in tokens divided by the key's
  weight; a request's start tag is the later of the queue's virtual time and its key's finish
  time, and the smallest start tag leaves first. A key that floods queues its requests far into
  virtual time; another key's next request starts at the queue's present and goes before them.
  An idle key earns no credit for its idle time.
- Costs are estimates when a request is queued (its prompt and a guess at its completion);
  `settle` corrects its key's finish time by what it really used, so a key is charged for the
  tokens it had, not for the requests it made.

Bounds: at most `max_per_key` requests of one key and class wait at once (QueueFull past it),
and each request leaves by its own deadline (`expired`).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

# While lower-class requests have waited past aging_s, one in this many requests to leave is
# the longest-waiting of them: at least a quarter of the engines' turns, at most a quarter
# taken from the higher classes.
AGED_TURN = 4


class QueueFull(Exception):
    """The key already has its bound of requests of this class waiting."""


@dataclass(eq=False)
class Ticket:
    """One waiting request. `priority`: its class's index, 0 the highest."""

    key_id: str
    priority: int
    cost: float  # estimated tokens
    weight: float
    arrived: float
    deadline: float
    start_tag: float = 0.0
    seq: int = 0
    gone: bool = field(default=False, repr=False)


@dataclass
class _Class:
    by_tag: list[tuple[float, int, Ticket]] = field(default_factory=list)
    by_age: deque[Ticket] = field(default_factory=deque)

    def oldest(self) -> Ticket | None:
        while self.by_age and self.by_age[0].gone:
            self.by_age.popleft()
        return self.by_age[0] if self.by_age else None

    def first_by_tag(self) -> Ticket | None:
        while self.by_tag and self.by_tag[0][2].gone:
            heapq.heappop(self.by_tag)
        return self.by_tag[0][2] if self.by_tag else None


class FairQueue:
    def __init__(self, classes: int, aging_s: float, max_per_key: int) -> None:
        self._classes = [_Class() for _ in range(classes)]
        self.aging_s = aging_s
        self.max_per_key = max_per_key
        self._virtual_time = 0.0
        self._finish: dict[str, float] = {}  # key -> its virtual finish time
        self._waiting: dict[tuple[str, int], int] = {}  # (key, class) -> requests waiting
        self._seq = itertools.count()
        self._len = 0
        # Turns the higher classes took since an aged lower-class request last had one.
        self._passed_over = 0

    def __len__(self) -> int:
        return self._len

    def waiting(self, key_id: str, priority: int) -> int:
        return self._waiting.get((key_id, priority), 0)

    def depths(self) -> dict[tuple[str, int], int]:
        """(key, class) -> requests waiting, for the metrics and the console."""
        return dict(self._waiting)

    def charge(self, ticket: Ticket) -> None:
        """Count a request that went straight through (nothing was waiting) against its key, as
        if it had been queued and served at once: when a queue forms, the keys that had the
        engines to themselves until then are behind those that did not."""
        start = max(self._virtual_time, self._finish.get(ticket.key_id, 0.0))
        ticket.start_tag = start
        self._finish[ticket.key_id] = start + ticket.cost / ticket.weight

    def push(self, ticket: Ticket) -> None:
        place = (ticket.key_id, ticket.priority)
        if self._waiting.get(place, 0) >= self.max_per_key:
            raise QueueFull
        self.charge(ticket)
        ticket.seq = next(self._seq)
        queue = self._classes[ticket.priority]
        heapq.heappush(queue.by_tag, (ticket.start_tag, ticket.seq, ticket))
        queue.by_age.append(ticket)
        self._waiting[place] = self._waiting.get(place, 0) + 1
        self._len += 1

    def pop(self, now: float) -> Ticket | None:
        """The request to send next, taken off the queue; None when none waits."""
        top = next((c for c in self._classes if c.oldest() is not None), None)
        if top is None:
            return None
        aged = self._longest_aged(below=top, now=now)
        if aged is not None and self._passed_over >= AGED_TURN - 1:
            # Out of the fair order: the queue's virtual time stays where it was.
            self._passed_over = 0
            self._take(aged)
            return aged
        fair = top.first_by_tag()
        assert fair is not None
        if aged is not None:
            self._passed_over += 1
        self._virtual_time = max(self._virtual_time, fair.start_tag)
        self._take(fair)
        return fair

    def _longest_aged(self, below: _Class, now: float) -> Ticket | None:
        """The longest-waiting request of a class below `below` that has waited aging_s."""
        if self.aging_s <= 0:
            return None
        lower = self._classes[self._classes.index(below) + 1 :]
        oldest = [t for c in lower if (t := c.oldest()) is not None]
        aged = [t for t in oldest if now - t.arrived >= self.aging_s]
        return min(aged, key=lambda t: t.arrived) if aged else None

    def remove(self, ticket: Ticket) -> bool:
        """Take a request off the queue (its client left); False when it was no longer on it."""
        if ticket.gone:
            return False
        self._take(ticket)
        # A request that never ran gives back the virtual time it was charged, when it is its
        # key's latest: the key's next request is not pushed back by it.
        finish = ticket.start_tag + ticket.cost / ticket.weight
        if self._finish.get(ticket.key_id) == finish:
            self._finish[ticket.key_id] = ticket.start_tag
        return True

    def expired(self, now: float) -> list[Ticket]:
        """The requests whose deadline has passed, taken off the queue."""
        late = [
            t for queue in self._classes for t in queue.by_age if not t.gone and t.deadline <= now
        ]
        for ticket in late:
            self.remove(ticket)
        return late

    def next_deadline(self) -> float | None:
        deadlines = [t.deadline for q in self._classes for t in q.by_age if not t.gone]
        return min(deadlines) if deadlines else None

    def settle(self, key_id: str, estimated: float, used: float, weight: float) -> None:
        """A request of this key finished having used `used` tokens where `estimated` were
        charged: its key's finish time moves by the difference (never behind the present)."""
        if key_id not in self._finish:
            return
        moved = self._finish[key_id] + (used - estimated) / weight
        self._finish[key_id] = max(moved, self._virtual_time)

    def forget_idle_keys(self) -> None:
        """Drop finish times that can no longer matter (behind the present, nothing waiting),
        so the map does not grow with every key ever seen."""
        waiting_keys = {key for key, _ in self._waiting}
        for key in [k for k, f in self._finish.items() if f <= self._virtual_time]:
            if key not in waiting_keys:
                del self._finish[key]

    def _take(self, ticket: Ticket) -> None:
        ticket.gone = True
        place = (ticket.key_id, ticket.priority)
        left = self._waiting[place] - 1
        if left:
            self._waiting[place] = left
        else:
            del self._waiting[place]
        self._len -= 1
