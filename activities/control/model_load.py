"""One look at a model's load, for its autoscaler: every node hosting a routable replica of the
model has its agent's metrics read (`GET NodeInventory.metrics_url`, served by
activities/agent/node_metrics.py: each engine's running and waiting requests and token counters,
as the agent last read them with the engines' own keys), READS_AT_ONCE at a time, and the
answer is the sums (workflows/contracts LoadTotals), never a list that grows with the fleet.

This worker needs no engine key: the agent's page is unauthenticated and names no secret.
A page counts only for the node it names (every family carries `node`) and for the model's
replicas routed there, so a URL that reaches another agent (a loopback address read from
another machine) reads as nothing, not as someone else's load. A reading older than
STALE_AFTER_S, a page that does not answer within READ_TIMEOUT_S, or a look past LOOK_BUDGET_S
leaves that node's engines unseen. Of the nodes left unread, up to `agents_to_ask`, chosen at
random, are handed back for the workflow to ask through their agents' queues (node_engine_load,
which reads the engines directly): an agent started without `--metrics-port` is still seen
now and then, at a bounded cost in history.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families
from temporalio import activity

from store.fleet import FleetTables
from workflows.contracts import (
    LoadTotals,
    ModelLoadReport,
    ModelLoadRequest,
    NodeReplicas,
    ReplicaState,
)
from workflows.names import ControlActivity

READS_AT_ONCE = 32
READ_TIMEOUT_S = 2.0
# The whole look, within the activity's start-to-close timeout (workflows/options.py
# MODEL_LOAD_TIMEOUT): nodes not read by then are unseen.
LOOK_BUDGET_S = 20.0
# The agent reads its engines every 2 s; a reading this old means its loop is stuck.
STALE_AFTER_S = 30.0
# A node's page is a few kilobytes (its GPUs and engines); anything far larger is not one.
MAX_PAGE_BYTES = 4 * 1024 * 1024

_UP = "llmgw_node_engine_metrics_up"
_RUNNING = "llmgw_node_engine_requests_running"
_WAITING = "llmgw_node_engine_requests_waiting"
_TOKENS = "llmgw_node_engine_tokens_total"
_AGE = "llmgw_node_telemetry_age_seconds"


class PageTooLarge(Exception):
    pass


def node_totals(page: str, node: str, replica_ids: Iterable[str]) -> LoadTotals | None:
    """The load of `replica_ids` on `node` as its agent's metrics page says: an engine counts
    as seen when the agent read its metrics (`..._metrics_up` 1). None when the page is not a
    fresh reading by that node's agent (so its engines are unseen)."""
    wanted = set(replica_ids)
    age: float | None = None
    up: dict[str, float] = {}
    values: dict[str, dict[str, float]] = {_RUNNING: {}, _WAITING: {}, _TOKENS: {}}
    try:
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.labels.get("node") != node:
                    continue
                if sample.name == _AGE:
                    age = sample.value
                    continue
                replica = sample.labels.get("replica", "")
                if replica not in wanted:
                    continue
                if sample.name == _UP:
                    up[replica] = sample.value
                elif sample.name in values:
                    values[sample.name][replica] = sample.value
    except ValueError:
        return None
    if age is None or age > STALE_AFTER_S:
        return None
    seen = [
        r
        for r in sorted(wanted)
        if up.get(r) == 1 and r in values[_RUNNING] and r in values[_WAITING]
    ]
    return LoadTotals(
        seen=len(seen),
        unseen=len(wanted) - len(seen),
        running=sum(int(values[_RUNNING][r]) for r in seen),
        waiting=sum(int(values[_WAITING][r]) for r in seen),
        work=sum(values[_TOKENS].get(r, 0.0) for r in seen),
    )


async def read_page(client: httpx.AsyncClient, url: str) -> str | None:
    """The page at `url`, or None when it does not answer 200 in time or is too large."""
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                return None
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_PAGE_BYTES:
                    raise PageTooLarge(url)
            return body.decode("utf-8", errors="replace")
    except (httpx.HTTPError, PageTooLarge):
        return None


class ModelLoadActivities:
    def __init__(
        self,
        tables: FleetTables,
        reads_at_once: int = READS_AT_ONCE,
        budget_s: float = LOOK_BUDGET_S,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.tables = tables
        self.reads_at_once = reads_at_once
        self.budget_s = budget_s
        self.timeout_s = timeout_s

    @activity.defn(name=ControlActivity.MODEL_LOAD)
    async def model_load(self, req: ModelLoadRequest) -> ModelLoadReport:
        routable = ReplicaState.routable()
        by_node: dict[str, list[str]] = {}
        for route in await self.tables.model_routes(req.model):
            if route.state in routable and route.model == req.model:
                by_node.setdefault(route.node, []).append(route.replica_id)
        urls = await self.tables.metrics_urls(by_node)
        read = await self._read_all(
            {node: url for node, url in urls.items() if url}, by_node, self.budget_s
        )
        totals = LoadTotals()
        for found in read.values():
            totals = totals.plus(found)
        unread = sorted(node for node in by_node if node not in read)
        # At random, so that over many looks every such node is asked now and then.
        asked = set(random.sample(unread, min(req.agents_to_ask, len(unread))))
        for node in unread:
            if node not in asked:
                totals = totals.plus(LoadTotals(unseen=len(by_node[node])))
        return ModelLoadReport(
            totals=totals,
            nodes=len(by_node),
            nodes_read=len(read),
            ask_agents=[NodeReplicas(node=n, replica_ids=by_node[n]) for n in sorted(asked)],
        )

    async def _read_all(
        self, urls: dict[str, str], by_node: dict[str, list[str]], budget_s: float
    ) -> dict[str, LoadTotals]:
        """Each node's totals whose page was read in time; READS_AT_ONCE pages at a time."""
        read: dict[str, LoadTotals] = {}
        gate = asyncio.Semaphore(self.reads_at_once)
        limits = httpx.Limits(max_connections=self.reads_at_once, max_keepalive_connections=0)
        # No redirects and no proxy from the environment: a page is read where the node's
        # inventory says, nowhere else.
        async with httpx.AsyncClient(
            timeout=self.timeout_s, limits=limits, follow_redirects=False, trust_env=False
        ) as client:

            async def one(node: str, url: str) -> None:
                async with gate:
                    page = await read_page(client, url)
                found = None if page is None else node_totals(page, node, by_node[node])
                if found is not None:
                    read[node] = found

            tasks = [asyncio.create_task(one(n, u)) for n, u in sorted(urls.items())]
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=budget_s)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
        return read
