"""Admission: a request is sent to an engine only while one of its model's replicas has room;
the rest wait here, in the model's fair queue (gateway/admission/fair_queue.py), and leave it in
its order as room appears.

Room is counted per model: each ready replica takes as many requests as its depth
(gateway/admission/depths.py) less what other gateways have there (its engine's gauges, as last
scraped), and this gateway's admitted requests fill it. Room appears when a request ends, a
scrape shows an engine with less work, or the routing table gains a replica; a ticker also runs
while anything waits, for deadlines and for the scrapes. A request that finds its model's queue
empty and room free passes at once, without waiting on anything.

A model without a ready replica queues nothing: the request goes on to be answered 503 (or
held for a cold start) as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gateway.admission.depths import ReplicaDepths
from gateway.admission.fair_queue import FairQueue, QueueFull, Ticket
from gateway.admission.fleet_share import slots
from gateway.errors import SERVER_ERROR, ApiError
from gateway.settings import GatewaySettings
from store.models import PRIORITY_CLASSES
from workflows.contracts import Route
from workflows.contracts.engine_facts import EXTERNAL

# While anything waits: how often deadlines and the engines' latest gauges are looked at.
TICK_S = 0.1
# The least weight a request is queued with: a millionth of a default key's.
MIN_WEIGHT = 1e-6
# How fast the measured queue wait (Retry-After) follows new waits.
WAIT_SMOOTHING = 0.2


@dataclass(frozen=True)
class QueuePolicy:
    classes: int
    aging_s: float
    max_per_key: int
    # Per class, highest first: the longest a request of that class waits here.
    deadlines_s: tuple[float, ...]

    @classmethod
    def of(cls, settings: GatewaySettings) -> QueuePolicy:
        """The batch class waits batch_queue_deadline_s, every other queue_deadline_s."""
        deadlines = tuple(
            settings.batch_queue_deadline_s if name == "batch" else settings.queue_deadline_s
            for name in PRIORITY_CLASSES
        )
        return cls(len(PRIORITY_CLASSES), settings.queue_aging_s, settings.queue_per_key, deadlines)


@dataclass(eq=False)
class Pass:
    """A request let through: hand it back with `AdmissionGate.leave` when it ends."""

    model: str
    ticket: Ticket | None  # None: passed while the gate was off or the model had no replica
    waited_s: float = 0.0
    counted: bool = True
    left: bool = field(default=False, repr=False)


@dataclass
class _Model:
    queue: FairQueue
    waiters: dict[Ticket, asyncio.Future[bool]] = field(default_factory=dict)
    admitted: int = 0
    by_key: Counter[str] = field(default_factory=Counter)  # admitted requests per key id
    wait_s: float = 0.0  # smoothed queue wait of recent requests, for Retry-After


class AdmissionGate:
    def __init__(
        self,
        policy: QueuePolicy,
        depths: ReplicaDepths,
        ready: Callable[[str], Iterable[Route]],
        others: Callable[[str, float], int | None],
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        refused: Callable[[str, str], None] | None = None,
        waited: Callable[[str, int, float], None] | None = None,
        fleet_share: Callable[[str], float | None] | None = None,
        key_part: Callable[[str, str], float] | None = None,
    ) -> None:
        """`ready(model)`: the model's ready routes now. `others(replica_id, now)`: requests
        other gateways have at that replica by its engine's last fresh gauges (None: unknown).
        `refused(model, reason)`, `waited(model, class, seconds)`: told of each request refused
        here and of each that waited, for the metrics. `fleet_share(model)`: the part of the
        model's room this gateway may fill while other gateways have requests waiting for it
        too (None: all of it), and `key_part(model, key_id)` the part of the key's weight it
        queues the key with here (gateway/admission/fleet_share.py)."""
        self.policy = policy
        self.depths = depths
        self.enabled = enabled
        self._ready = ready
        self._others = others
        self._clock = clock
        self._refused = refused or (lambda _model, _reason: None)
        self._waited = waited or (lambda _model, _class, _seconds: None)
        self._fleet_share = fleet_share or (lambda _model: None)
        self._key_part = key_part or (lambda _model, _key_id: 1.0)
        self._models: dict[str, _Model] = {}
        self._names: dict[str, str] = {}  # key id -> its name, for what is shown
        self._weights: dict[str, float] = {}  # key id -> its weight, as its last request said
        self._ticker: asyncio.Task[None] | None = None

    # -- what requests call

    async def enter(
        self,
        model: str,
        key_id: str,
        priority: int,
        cost: float,
        weight: float,
        time_left_s: float,
        key_name: str = "",
    ) -> Pass:
        """Wait until the request may go to an engine. `time_left_s`: what is left of the
        request's own deadline (its client's timeout); the class's queue deadline may shorten
        it. Raises ApiError 429 when the key's queue for this class is full, 503 when no room
        came in time."""
        if not self.enabled:
            return Pass(model, None, counted=False)
        state = self._model(model)
        now = self._clock()
        deadline = now + min(time_left_s, self.policy.deadlines_s[priority])
        # A key other gateways queue too weighs here only its part (fleet_share.key_parts). Never
        # below MIN_WEIGHT: a key may be given any weight above 0, and 100 / 5e-324 is infinite.
        part = max(weight * self._key_part(model, key_id), MIN_WEIGHT)
        ticket = Ticket(key_id, priority, cost, part, now, deadline)
        if not state.queue and self._room(model, now) > 0:
            state.queue.charge(ticket)
            state.admitted += 1
            state.by_key[key_id] += 1
            self._weights[key_id] = weight
            return Pass(model, ticket)
        if not self._has_replicas(model):
            return Pass(model, None, counted=False)
        self._names[key_id] = key_name or key_id
        self._weights[key_id] = weight
        try:
            state.queue.push(ticket)
        except QueueFull:
            self._refused(model, "queue_full")
            raise ApiError(
                429,
                f"This key already has {self.policy.max_per_key} requests of this priority "
                f"waiting for the model '{model}'; try again later.",
                type_="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": self._retry_after(state)},
            ) from None
        # Its result: whether the pass counts against the model's room (see Pass.counted).
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        state.waiters[ticket] = waiter
        self._dispatch(model)
        self._start_ticker()
        try:
            counted = await waiter
        except asyncio.CancelledError:
            # The client left (or the server is stopping): off the queue at once, and a pass
            # handed over just before is handed back.
            state.queue.remove(ticket)
            state.waiters.pop(ticket, None)
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.leave(Pass(model, ticket, counted=waiter.result()), None)
            raise
        waited = self._clock() - now
        state.wait_s += WAIT_SMOOTHING * (waited - state.wait_s)
        self._waited(model, priority, waited)
        return Pass(model, ticket, waited_s=waited, counted=counted)

    def leave(self, admitted: Pass, used_tokens: float | None) -> None:
        """The request ended; `used_tokens`: what it really used, when known (its key is
        charged that rather than the estimate)."""
        if admitted.left or not admitted.counted:
            return
        admitted.left = True
        state = self._model(admitted.model)
        state.admitted -= 1
        ticket = admitted.ticket
        if ticket is not None:
            state.by_key[ticket.key_id] -= 1
            if state.by_key[ticket.key_id] <= 0:
                del state.by_key[ticket.key_id]
        if ticket is not None and used_tokens is not None:
            state.queue.settle(ticket.key_id, ticket.cost, used_tokens, ticket.weight)
        if not state.queue and not state.admitted:
            state.queue.forget_idle_keys()  # the model is idle: no key's past can matter
        self._dispatch(admitted.model)

    # -- what the gateway's loops call

    def observe(self, samples: Mapping[str, tuple[int, int]], model_of: Mapping[str, str]) -> None:
        """A scrape round: replica_id -> (running, waiting) from its engine's gauges, and each
        replica's model. Depths learn from them; room the engines freed is handed out."""
        for replica_id, (running, waiting) in samples.items():
            model = model_of.get(replica_id)
            state = self._models.get(model) if model is not None else None
            held_back = state is not None and bool(state.queue)
            self.depths.observe(replica_id, running, waiting, held_back)
        self.kick()

    def kick(self) -> None:
        """Hand out whatever room there is, in every model (after a scrape or a route change)."""
        for model in list(self._models):
            self._dispatch(model)

    # -- what the gate knows

    def room(self, model: str) -> int:
        """How many more requests this gateway may send the model's replicas now."""
        return self._room(model, self._clock())

    def _room(self, model: str, now: float) -> int:
        # Each replica's depth, less what other gateways' requests there take of it; written
        # out rather than called per replica, since every request counts the room.
        depths, others = self.depths, self._others
        total = capacity = 0
        for route in self._ready(model):
            replica_id = route.replica_id
            depth = depths.depth(replica_id, route.slots, route.engine != EXTERNAL)
            capacity += depth
            left = depth - (others(replica_id, now) or 0)
            if left > 0:
                total += left
        share = self._fleet_share(model)
        if share is not None:
            # A share of the model's slots: the others' requests are already out of `total`.
            total = min(total, slots(share, capacity))
        state = self._models.get(model)
        return total - (state.admitted if state is not None else 0)

    def at_depth(self, routes: Iterable[Route], own: Mapping[str, int]) -> set[str]:
        """The replicas among `routes` that hold their depth: this gateway's requests there
        (`own`, per replica) and the other gateways' (their engine's gauges)."""
        now = self._clock()
        # Written out as in _room: every request with the fair queue on asks this.
        depths, others = self.depths, self._others
        full = set()
        for route in routes:
            replica_id = route.replica_id
            depth = depths.depth(replica_id, route.slots, route.engine != EXTERNAL)
            if own.get(replica_id, 0) >= depth - (others(replica_id, now) or 0):
                full.add(replica_id)
        return full

    def waiting(self) -> dict[str, dict[tuple[str, int], int]]:
        """model -> (key name, class) -> requests waiting."""
        return {
            model: {(self._names.get(k, k), c): n for (k, c), n in s.queue.depths().items()}
            for model, s in self._models.items()
            if s.queue
        }

    def oldest_waits(self) -> dict[str, dict[tuple[str, int], float]]:
        """model -> (key name, class) -> seconds its longest-waiting request has waited so far."""
        now = self._clock()
        out: dict[str, dict[tuple[str, int], float]] = {}
        for model, state in self._models.items():
            arrived: dict[tuple[str, int], float] = {}
            for ticket in state.waiters:
                place = (self._names.get(ticket.key_id, ticket.key_id), ticket.priority)
                arrived[place] = min(arrived.get(place, ticket.arrived), ticket.arrived)
            if arrived:
                out[model] = {place: max(0.0, now - at) for place, at in arrived.items()}
        return out

    def demand(self) -> dict[str, dict[str, tuple[float, int, int]]]:
        """model -> key id -> (weight, requests waiting, requests admitted): what this gateway
        tells the others (gateway/admission/fleet_share.py)."""
        out: dict[str, dict[str, tuple[float, int, int]]] = {}
        for model, state in self._models.items():
            waiting = Counter[str]()
            for (key_id, _), count in state.queue.depths().items():
                waiting[key_id] += count
            keys = set(waiting) | set(state.by_key)
            if keys:
                out[model] = {
                    k: (self._weights.get(k, 1.0), waiting[k], state.by_key[k]) for k in keys
                }
        return out

    def admitted(self) -> dict[str, int]:
        return {m: s.admitted for m, s in self._models.items() if s.admitted}

    # -- inside

    def _model(self, model: str) -> _Model:
        state = self._models.get(model)
        if state is None:
            policy = self.policy
            queue = FairQueue(policy.classes, policy.aging_s, policy.max_per_key)
            state = self._models[model] = _Model(queue)
        return state

    def _has_replicas(self, model: str) -> bool:
        return any(True for _ in self._ready(model))

    def _dispatch(self, model: str) -> None:
        state = self._models.get(model)
        if state is None or not state.queue:
            return
        now = self._clock()
        for late in state.queue.expired(now):
            self._refuse_late(model, state, late)
        if not self._has_replicas(model):
            # Every replica left while requests waited: they go on, to be answered as any
            # request for a model without a ready replica is.
            while (waiting := state.queue.pop(now)) is not None:
                self._hand_over(state, waiting, counted=False)
            return
        room = self._room(model, now)
        while room > 0 and (ticket := state.queue.pop(now)) is not None:
            if self._hand_over(state, ticket, counted=True):
                room -= 1

    def _hand_over(self, state: _Model, ticket: Ticket, counted: bool) -> bool:
        waiter = state.waiters.pop(ticket, None)
        if waiter is None or waiter.done():
            return False
        if counted:
            state.admitted += 1
            state.by_key[ticket.key_id] += 1
        waiter.set_result(counted)
        return counted

    def _refuse_late(self, model: str, state: _Model, ticket: Ticket) -> None:
        waiter = state.waiters.pop(ticket, None)
        if waiter is None or waiter.done():
            return
        self._refused(model, "queue_timeout")
        waiter.set_exception(
            ApiError(
                503,
                f"The replicas of the model '{model}' stayed busy for as long as this request "
                "could wait; try again later.",
                type_=SERVER_ERROR,
                code="queue_timeout",
                headers={"Retry-After": self._retry_after(state)},
            )
        )

    def _retry_after(self, state: _Model) -> str:
        return str(max(1, math.ceil(state.wait_s)))

    def _start_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while any(s.queue for s in self._models.values()):
            await asyncio.sleep(TICK_S)
            self.kick()

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
