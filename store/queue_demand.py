"""The fair queue's demand, shared by the gateways on one store (gateway/queue_exchange.py): one
row per gateway and model, holding each key's weight and its requests waiting and admitted on
that gateway, as JSON, and when it was written by the store's clock.

A gateway replaces all of its rows at once, in one transaction, and deletes every row (its own
or another's) older than the bound readers apply: a gateway that stopped is forgotten by the
next one that writes. Nothing here is kept across a restart that matters: the rows describe
requests in flight.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from store.validate import check_text

# A key's (weight, requests waiting, requests admitted) on one gateway for one model.
KeyDemand = tuple[float, int, int]
# model -> key id -> its demand: one gateway's whole report.
Demand = Mapping[str, Mapping[str, KeyDemand]]


@dataclass(frozen=True)
class DemandReport:
    """One gateway's rows as read, `age_s` old by the store's clock (its oldest row's age)."""

    gateway: str
    age_s: float
    demand: dict[str, dict[str, KeyDemand]] = field(default_factory=dict)


def demand_rows(gateway: str, demand: Demand) -> list[tuple[str, str]]:
    """(model, JSON) rows of one gateway's report; the names checked as the store checks every
    text, the numbers as the gate made them (a non-finite weight is refused)."""
    check_text(gateway, "gateway id")
    rows = []
    for model, keys in sorted(demand.items()):
        check_text(model, "model")
        encoded: dict[str, list[float | int]] = {}
        for key_id, (weight, waiting, admitted) in sorted(keys.items()):
            check_text(key_id, "key id")
            if not math.isfinite(weight):
                raise ValueError(f"invalid weight {weight!r} for key {key_id!r}")
            encoded[key_id] = [float(weight), int(waiting), int(admitted)]
        if encoded:
            rows.append((model, json.dumps(encoded, sort_keys=True, separators=(",", ":"))))
    return rows


def decode_demand(text: str) -> dict[str, KeyDemand]:
    """A row's keys; what is not a key id with three numbers is left out (the table is shared,
    and one gateway's bad row must not stop the others from reading theirs)."""
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    out: dict[str, KeyDemand] = {}
    for key_id, value in found.items():
        if not (isinstance(value, list) and len(value) == 3):
            continue
        weight, waiting, admitted = value
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            continue
        if not math.isfinite(weight):
            continue
        out[str(key_id)] = (float(weight), int(waiting), int(admitted))
    return out


def reports(rows: list[tuple[str, str, str, float]], now: float) -> list[DemandReport]:
    """(gateway, model, JSON, updated_at) rows, grouped by gateway, by gateway id."""
    by_gateway: dict[str, DemandReport] = {}
    for gateway, model, text, updated_at in rows:
        age = max(now - updated_at, 0.0)
        known = by_gateway.get(gateway)
        if known is None:
            known = by_gateway[gateway] = DemandReport(gateway, age)
        elif age > known.age_s:
            known = by_gateway[gateway] = DemandReport(gateway, age, known.demand)
        known.demand[model] = decode_demand(text)
    return [by_gateway[g] for g in sorted(by_gateway)]
