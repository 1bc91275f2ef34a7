"""The part of a model's slots this gateway may fill while other gateways on the same store have
requests waiting for it too, and the part of a key's weight each gateway queues it with.

Pure: fed with this gateway's demand (AdmissionGate.demand: per model, each key's weight and
its requests waiting and admitted here) and the other gateways' last reports of theirs
(gateway/queue_exchange.py, through the store). Each gateway's fair queue is fair only among
its own requests; these two numbers make the gateways, together, fair among keys:

- **A key's weight is split among the gateways it uses**, in proportion to its requests
  (waiting plus admitted) on each. A key with 10 requests here and 30 elsewhere queues here
  with a quarter of its weight (`key_parts`), so a key that spreads its requests over N
  gateways weighs, in all, what it weighs on one.
- **A gateway's demand** is the sum of its keys' parts; **its share** of the model's slots is
  its demand over the sum of every gateway's (`share`). Three interactive keys here and a
  flooding key split over here and one other gateway: this gateway's demand is 3 + 1/2, the
  other's 1/2, so this one may fill 7/8 of the slots, within which the flood's part weighs
  1/2 against each interactive key's 1; the flood gets 1/8 + 1/8 of the slots in all, each
  interactive key 1/4, as on one gateway.
- **Only while another gateway has requests waiting** for the model (`share` is None
  otherwise: this gateway may fill every free slot). A share never holds a slot idle that
  nobody else is waiting for, so an idle fleet serves one gateway's flood at full speed; a
  gateway that cannot use its share leaves nothing waiting, and the others fill the rest
  once they hear of it.
- **Fresh reports only** (`fresh`): a gateway that stopped reporting (it stopped, or lost the
  store) counts for nothing once its report is older than a few exchange periods.
- **Whole slots** (`slots`): a share of the model's slots is rounded to the nearest whole
  slot, and is at least one, so a gateway with requests is never shut out. Two gateways'
  rounded shares always add up to at least every slot (one's fraction is 1 minus the other's),
  so neither waits at its cap while a slot is idle; three or more waiting at once can leave a
  slot unused in each two (with llama.cpp's 4 slots and three gateways, a quarter of them until
  one stops waiting). Rounding up instead would never leave one idle, but gives each gateway up
  to one slot beyond its share, and the learnt depth (one above what the engine runs,
  gateway/admission/depths.py) adds to that: a flood on one gateway against three keys on
  another would keep 2 of 4 slots, not 1.

A share below what this gateway has admitted only means it admits nothing more until its
requests end below it: no request is cut off.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# A key's (weight, requests waiting, requests admitted) on one gateway for one model.
KeyDemand = tuple[float, int, int]
# key id -> its demand, for one model on one gateway.
ModelDemand = Mapping[str, KeyDemand]
# model -> its demand, on one gateway: what AdmissionGate.demand returns.
Demand = Mapping[str, ModelDemand]

# A share computed from floats may land a hair below a half.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Report:
    """One other gateway's demand as the store had it, `age_s` old."""

    gateway: str
    age_s: float
    demand: Demand


def fresh(reports: Iterable[Report], me: str, max_age_s: float) -> list[Report]:
    """The other gateways' reports no older than `max_age_s` (this gateway's own left out)."""
    return [r for r in reports if r.gateway != me and r.age_s <= max_age_s]


def _requests(demand: KeyDemand) -> int:
    _, waiting, admitted = demand
    return max(waiting, 0) + max(admitted, 0)


def gateway_demands(gateways: Sequence[ModelDemand]) -> list[float]:
    """Each gateway's demand for one model: the sum over its keys of the key's weight times
    the fraction of the key's requests (over every gateway) that are on it."""
    totals: dict[str, int] = {}
    for demand in gateways:
        for key_id, key in demand.items():
            totals[key_id] = totals.get(key_id, 0) + _requests(key)
    out = []
    for demand in gateways:
        total = 0.0
        for key_id, key in demand.items():
            requests, weight = _requests(key), max(key[0], 0.0)
            if requests and totals[key_id]:
                total += weight * requests / totals[key_id]
        out.append(total)
    return out


def share(mine: ModelDemand, others: Sequence[ModelDemand]) -> float | None:
    """The fraction of the model's slots this gateway may fill; None (all it finds free) unless
    another gateway has requests waiting for the model."""
    if not any(key[1] > 0 for demand in others for key in demand.values()):
        return None
    demands = gateway_demands([mine, *others])
    whole = sum(demands)
    if whole <= 0:
        return None
    return demands[0] / whole


def key_parts(mine: ModelDemand, others: Sequence[ModelDemand]) -> dict[str, float]:
    """key id -> the part of its weight this gateway queues it with, for the keys that other
    gateways have requests of (every other key: 1). A key with no request here yet is counted
    as having one, its next."""
    elsewhere: dict[str, int] = {}
    for demand in others:
        for key_id, key in demand.items():
            if requests := _requests(key):
                elsewhere[key_id] = elsewhere.get(key_id, 0) + requests
    parts = {}
    for key_id, there in elsewhere.items():
        here = max(_requests(mine[key_id]) if key_id in mine else 0, 1)
        parts[key_id] = here / (here + there)
    return parts


def slots(fraction: float, capacity: int) -> int:
    """The slots a share of `capacity` comes to: the nearest whole number (a half up), at least
    one."""
    return max(1, math.floor(fraction * capacity + 0.5 + _EPSILON))


@dataclass(frozen=True)
class FleetView:
    """What one exchange round worked out, served from memory until the next: per model, this
    gateway's share (None: all) and its keys' weight parts."""

    shares: Mapping[str, float | None] = field(default_factory=dict)
    parts: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def share(self, model: str) -> float | None:
        return self.shares.get(model)

    def key_part(self, model: str, key_id: str) -> float:
        return self.parts.get(model, {}).get(key_id, 1.0)


def fleet_view(mine: Demand, others: Sequence[Report]) -> FleetView:
    """Shares and weight parts for every model that some other gateway reports demand for
    (models only this gateway serves need neither)."""
    models = {model for report in others for model in report.demand}
    shares: dict[str, float | None] = {}
    parts: dict[str, dict[str, float]] = {}
    for model in sorted(models):
        theirs = [r.demand[model] for r in others if model in r.demand]
        here = mine.get(model, {})
        shares[model] = share(here, theirs)
        if found := key_parts(here, theirs):
            parts[model] = found
    return FleetView(shares, parts)
