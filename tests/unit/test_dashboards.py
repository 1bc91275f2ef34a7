"""The Grafana dashboards and the Prometheus scrape config in deploy/ ask only for what llmgw
serves: every metric a panel queries is one the gateway or a node agent exports (or an
engine's, as its adapter names it), and Prometheus scrapes where the gateway and `llmgw up`'s
agent listen by default."""

import json
import re
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from activities.agent.engine_memory import EngineMemory
from activities.agent.gpu_telemetry import GpuSample, TelemetryReading
from activities.agent.node_metrics import METRICS_PATH, EngineLoadSample, NodeReading, render
from engines.registry import engines
from gateway.front_door import ADMIN_ONLY_PATHS
from gateway.kv.feeds import FeedCounters
from gateway.kv.publishers import PublisherCounters
from gateway.metrics import GatewayMetrics
from gateway.routing.states import Expected, Routed
from gateway.settings import GatewaySettings
from workers.up import UpOptions
from workflows.contracts import EngineLoad, GpuFabric, GpuInfo, ImexInfo, NodeInventory

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))

# PromQL words that look like identifiers but are not metrics. Functions are recognised by the
# "(" that follows them, so only keywords and the like need listing.
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"and", "or", "unless", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
# Label matchers {…}, ranges and subqueries […], and label lists after by/without/on/ignoring/
# group_left/group_right: none of them name a metric.
_MATCHERS = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions (no
    "(" after them), keywords, labels, durations or Grafana variables."""
    expr = _STRING.sub('""', expr)
    expr = _MATCHERS.sub(" ", expr)
    expr = _LABEL_LIST.sub(" ", expr)
    return {
        name for name, call in _IDENT.findall(expr) if not call and name.lower() not in _KEYWORDS
    }


def test_metric_names_finds_selectors_only() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, model) (rate(a_bucket{model=~"$model", le!="1e3"}'
        "[$__rate_interval]))) / on (model) group_left sum without (x) (b_total offset 5m) "
        "> bool 1e3 or vllm:num_requests_running"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "vllm:num_requests_running"}


def _populated_gateway_metrics() -> GatewayMetrics:
    """The gateway's registry with one sample of everything, so collecting it gives every
    sample name a scrape can show (a histogram with negative buckets has no _sum: only a real
    collection says so). The KV feeds and publishers are stand-ins with the real counters."""
    metrics = GatewayMetrics()
    metrics.request("m", "chat", 200, 0.1)
    metrics.first_token("m", 0.05)
    metrics.tokens("m", 3, 4)
    metrics.upstream_error("m", "timeout")
    metrics.retry("m")
    metrics.routed("m", "prefix")
    metrics.routing_state("m", Routed("approximate", "sent_record"))
    metrics.routing_checked("m", Expected("approximate", 128, 64), 0)
    metrics.quota_rejected("rpm")
    metrics.auth_failed("unknown_key")
    metrics.in_flight.value += 1
    metrics.kv_tokenized("ok", 0.01)
    metrics.kv_cache_error("m", 10, 8)
    metrics.queue_waited("m", "interactive", 0.5)
    metrics.queue_refused("m", "queue_full")
    feeds = SimpleNamespace(
        counters=lambda: {("http://agent/kv", "node-a"): FeedCounters()},
        readers=lambda: [SimpleNamespace(node="node-a", live=True)],
        index=SimpleNamespace(replicas=lambda: ["r1"], size=lambda _: 1),
    )
    publishers = SimpleNamespace(
        counters=lambda: {("tcp://pub", "tcp://replay", ""): PublisherCounters()},
        subscriptions=lambda: [SimpleNamespace(key=("tcp://pub", "", ""), connected=True)],
    )
    metrics.watch_kv(feeds, publishers)  # type: ignore[arg-type]
    return metrics


def _populated_agent_metrics() -> str:
    """An agent's page with one of everything: a card with every figure and wear signal, a
    MIG instance, and an engine read."""
    card = GpuSample(
        index=0,
        uuid="GPU-a",
        name="H100",
        utilization_pct=50,
        memory_used_mb=1,
        memory_total_mb=2,
        temperature_c=60,
        power_w=300,
        power_limit_w=700,
        ecc_corrected=1,
        ecc_uncorrected=0,
        retired_pages_single_bit=0,
        retired_pages_double_bit=0,
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=0,
        remap_pending=False,
        remap_failed=False,
        throttle={"sw_power_cap": True},
    )
    mig = GpuSample(index=1000, uuid="MIG-a", name="m", parent=0, memory_used_mb=1)
    memory = EngineMemory(rss_bytes=1, gpu_memory_mb=1)
    engine = EngineLoadSample("m-0", "vllm", EngineLoad(replica_id="m-0", running=1), memory)
    fabric = GpuFabric(state="Completed", status="Success", cluster_uuid="1-2", bandwidth="Full")
    gpu = GpuInfo(index=0, uuid="GPU-a", name="g", gpu_class="g", memory_mb=1, fabric=fabric)
    imex = ImexInfo(installed=True, running=True, channels=[0])
    inventory = NodeInventory(name="node-a", gpus=[gpu], imex=imex)
    reading = NodeReading(
        TelemetryReading([card, mig], "nvml"), [engine], read_at=0.0, inventory=inventory
    )
    return render("node-a", reading).decode()


def _agent_families() -> list[Any]:
    return list(text_string_to_metric_families(_populated_agent_metrics()))


def exported_names() -> set[str]:
    names = {
        sample.name
        for family in _populated_gateway_metrics().registry.collect()
        for sample in family.samples
    }
    names |= {sample.name for family in _agent_families() for sample in family.samples}
    for engine in engines():
        declared = engine.metrics
        if declared is not None:
            names |= {declared.running, declared.waiting}
            names |= {declared.kv_usage} if declared.kv_usage else set()
    return names


def test_the_populated_registry_shows_every_family() -> None:
    # Otherwise a family left out of the stand-ins would look like a metric nobody exports.
    families = list(_populated_gateway_metrics().registry.collect())
    assert all(family.samples for family in families), [
        family.name for family in families if not family.samples
    ]
    names = {sample.name for family in families for sample in family.samples}
    assert {f"llmgw_kv_feed_{f.name}_total" for f in fields(FeedCounters)} <= names
    assert {f"llmgw_kv_publisher_{f.name}_total" for f in fields(PublisherCounters)} <= names
    agent = _agent_families()
    assert all(family.samples for family in agent), [f.name for f in agent if not f.samples]
    # The node agent's own families are named for what they measure.
    assert all(f.name.startswith(("llmgw_node_", "llmgw_gpu_")) for f in agent)


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, rows' nested panels included, and every
    templating query (label_values(metric, label): the label is not a metric)."""
    found = []
    panels = list(dashboard.get("panels", []))
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            found.append((f"{panel['title']} / {target['refId']}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable["type"] == "query" and query:
            found.append((f"${variable['name']}", re.sub(r",\s*\w+\s*\)$", ")", query)))
    return found


def test_there_are_dashboards() -> None:
    assert [path.name for path in DASHBOARDS] == ["llmgw-gateway.json", "llmgw-nodes.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_queried_metric_is_exported(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"].startswith("llmgw-")
    exported = exported_names()
    queries = _queries(dashboard)
    assert queries
    unknown = {}
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        if missing := names - exported:
            unknown[where] = sorted(missing)
    assert unknown == {}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_panels_use_the_datasource_variable(path: Path) -> None:
    # A fixed datasource uid would break the dashboard in every Grafana but the one it was
    # exported from.
    dashboard = json.loads(path.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in dashboard["panels"]:
        for item in [panel, *panel.get("targets", [])]:
            if "datasource" in item:
                assert item["datasource"]["uid"] == "${datasource}", panel["title"]


def _jobs() -> dict[str, Any]:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_prometheus_scrapes_the_gateway_admin_listener() -> None:
    job = _jobs()["llmgw-gateway"]
    defaults = GatewaySettings()
    assert job["metrics_path"] in ADMIN_ONLY_PATHS  # served on the admin listener only
    targets = [t for c in job["static_configs"] for t in c["targets"]]
    assert targets == [f"{defaults.admin_host}:{defaults.admin_port}"]


def test_prometheus_scrapes_the_agent_that_llmgw_up_starts() -> None:
    assert set(_jobs()) == {"llmgw-gateway", "llmgw-agents"}
    job = _jobs()["llmgw-agents"]
    assert job["metrics_path"] == METRICS_PATH
    targets = [t for c in job["static_configs"] for t in c["targets"]]
    assert targets == [f"127.0.0.1:{UpOptions(node='n').metrics_port}"]


def test_grafana_provisioning_parses() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources.yml").read_text())
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    dashboards = yaml.safe_load((provisioning / "dashboards.yml").read_text())
    assert [p["type"] for p in dashboards["providers"]] == ["file"]
