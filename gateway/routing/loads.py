"""What each engine says it is doing, scraped from its /metrics, for the router to read.

A gateway counts only its own requests in flight; an engine's running and waiting gauges count
every gateway's, and its queue, which is what decides how long a new request waits. The
integrator's loop calls `scrape_all` every second or so and hands the result to an
`EngineLoadBoard`; the router reads the board in memory and never waits on a scrape. Each sample
also keeps how many of its requests were this gateway's when it was read, so the router adds
only the others' to its own current count: the engine's figure is up to a scrape period old,
and read alone it would show this gateway's requests that have since finished (after a burst,
an idle replica would look busy until the next scrape). A sample older than `max_age_s` is
ignored: a replica whose metrics stopped answering is judged by the gateway's own count alone
rather than by a stale picture.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from engines.metrics import kv_cache_blocks, kv_usage, load
from workflows.contracts import Route

# About five scrape periods: one slow or missed scrape does not blind the router.
DEFAULT_MAX_AGE_S = 5.0


@dataclass(frozen=True, slots=True)
class LoadSample:
    running: int
    waiting: int
    kv_usage: float | None  # 0-1 share of the KV cache in use; None where the engine has none
    taken_at: float  # the caller's monotonic clock
    kv_blocks: int | None = None  # the KV cache's size in blocks, where the engine says (vLLM)
    own: int = 0  # this gateway's requests in flight there when the sample was read

    @property
    def others(self) -> int:
        """The engine's requests that this gateway did not send: other gateways' (or clients'
        straight to the engine). Never below 0: a request this gateway had just sent may not
        have reached the engine's gauges yet."""
        return max(0, self.running + self.waiting - self.own)


def sample_from_metrics(metrics_text: str, taken_at: float, own: int = 0) -> LoadSample | None:
    """A sample from an engine's Prometheus text, or None when it has no request gauges (for
    example a llama-server started without --metrics answers 501, or a proxy's own page).
    `own`: this gateway's requests in flight to that engine as the text arrived."""
    found = load(metrics_text)
    if found is None:
        return None
    return LoadSample(
        found.running,
        found.waiting,
        kv_usage(metrics_text),
        taken_at,
        kv_cache_blocks(metrics_text),
        own,
    )


class PeerLoads(Protocol):
    """The other gateways' requests in flight as they tell them (gateway/peers/picture.py)."""

    def others(self, replica_id: str) -> int | None: ...


class EngineLoadBoard:
    """The latest sample per replica."""

    def __init__(self, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self._latest: dict[str, LoadSample] = {}
        # replica_id -> (its latest sample's taken_at, LoadSample.others): `others` runs for
        # every ready replica several times a request, a sample changes once a scrape.
        self._others: dict[str, tuple[float, int]] = {}
        # Where the other gateways say what they have in flight (gateway/peers/): fresher than
        # any engine sample (tens of milliseconds against up to a scrape period).
        self.peers: PeerLoads | None = None

    def record(self, replica_id: str, sample: LoadSample) -> None:
        current = self._latest.get(replica_id)
        # Scrapes overlap when one is slow: never let an older answer replace a newer one.
        if current is None or sample.taken_at >= current.taken_at:
            self._latest[replica_id] = sample
            self._others[replica_id] = (sample.taken_at, sample.others)

    def update(self, samples: Mapping[str, LoadSample], now: float | None = None) -> None:
        """Record a scrape round's samples; given `now`, also drop samples too old to be read
        again, so replicas that stopped being scraped do not linger."""
        for replica_id, sample in samples.items():
            self.record(replica_id, sample)
        if now is not None:
            stale = [r for r, s in self._latest.items() if now - s.taken_at > self.max_age_s]
            for replica_id in stale:
                del self._latest[replica_id]
                del self._others[replica_id]

    def latest(self, replica_id: str, now: float) -> LoadSample | None:
        """The replica's sample if it is fresh enough to trust, else None."""
        sample = self._latest.get(replica_id)
        if sample is None or now - sample.taken_at > self.max_age_s:
            return None
        return sample

    def others(self, replica_id: str, now: float) -> int | None:
        """The requests in flight at the replica that this gateway did not send, by the engine's
        latest sample (`LoadSample.others`) and what the other gateways say they have there now
        (gateway/peers/, while every one is heard): the larger. The engine's figure also counts
        senders that are not on the bus (clients calling the engine, a gateway with the bus
        off) but is up to a scrape old; the peers' is fresh, so a burst they sent since the
        scrape counts at once. None with neither."""
        # `latest` written out, on the counts kept with each sample: the admission gate and
        # the router ask this per replica for every request.
        held = self._others.get(replica_id)
        measured = None if held is None or now - held[0] > self.max_age_s else held[1]
        peers = self.peers
        told = peers.others(replica_id) if peers is not None else None
        if told is None:
            return measured
        return told if measured is None else max(told, measured)

    def age_s(self, replica_id: str, now: float) -> float | None:
        sample = self._latest.get(replica_id)
        return None if sample is None else now - sample.taken_at

    def forget(self, replica_id: str) -> None:
        self._latest.pop(replica_id, None)
        self._others.pop(replica_id, None)

    def retain(self, replica_ids: Iterable[str]) -> None:
        """Drop samples of replicas not in `replica_ids` (they left the routing table)."""
        keep = set(replica_ids)
        for replica_id in [r for r in self._latest if r not in keep]:
            del self._latest[replica_id]
            del self._others[replica_id]


class EngineUnreachable(Exception):
    """Raised by a scrape's `fetch_text` when nothing answered at the engine's address (refused,
    reset, closed): the engine is down, unlike one that answers without metrics or slowly."""


class NoMetricsPage(Exception):
    """Raised by a scrape's `fetch_text` when the engine answers that it has no metrics page (a
    llama-server started without --metrics answers 501; a proxy 404)."""


class ScrapeRound(dict[str, LoadSample]):
    """replica_id -> sample for each engine that answered, plus `failures`: replica_id -> why
    no sample came back, for the log; `unreachable`, those of them that nothing answered for,
    which the breaker counts; and `ungauged`, those that answered with nothing to read (no
    metrics page, or one without request gauges), which no later scrape will change until the
    engine restarts. A metrics page that errs otherwise, or is late on a loaded machine, says
    nothing of the engine's requests."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[str, str] = {}
        self.unreachable: set[str] = set()
        self.ungauged: set[str] = set()


async def scrape_all(
    routes: Iterable[Route],
    fetch_text: Callable[[Route], Awaitable[str]],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    own: Mapping[str, int] | None = None,
) -> ScrapeRound:
    """Scrape every route's engine at once, each bounded by `timeout_s`, so one hung engine
    delays nobody else's sample. `fetch_text` returns the metrics page's text (it knows the
    URL, `engines.metrics.metrics_path(route.engine)`, and the engine key) and raises
    on any failure. `own`: this gateway's live count of requests in flight per replica, read
    as each answer arrives (`LoadSample.own`)."""
    ordered = list(routes)

    result = ScrapeRound()

    async def one(route: Route) -> LoadSample | str:
        try:
            async with asyncio.timeout(timeout_s):
                text = await fetch_text(route)
        except TimeoutError:
            return f"no answer within {timeout_s:g}s"
        except EngineUnreachable as exc:
            result.unreachable.add(route.replica_id)
            return str(exc)
        except NoMetricsPage as exc:
            result.ungauged.add(route.replica_id)
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - fetch_text raises on any failure: its reason
            return f"{type(exc).__name__}: {exc}"
        mine = own.get(route.replica_id, 0) if own is not None else 0
        sample = sample_from_metrics(text, clock(), mine)
        if sample is None:
            result.ungauged.add(route.replica_id)
            return "no request gauges in its metrics"
        return sample

    outcomes = await asyncio.gather(*(one(route) for route in ordered))
    for route, outcome in zip(ordered, outcomes, strict=True):
        if isinstance(outcome, LoadSample):
            result[route.replica_id] = outcome
        else:
            result.failures[route.replica_id] = outcome
    return result
