"""The Grafana dashboards in deploy/ against a real Prometheus (Debian's package) scraping a
real `llmgw up` (the stand-in engine in place of llama-server): the gateway's admin /metrics
and its node agent's /metrics, through the scrape jobs of deploy/prometheus/prometheus.yml.
After some traffic, every panel query of every dashboard is sent as Grafana would send it
(its variables substituted by tests/dashboard_queries.py) to Prometheus' HTTP API: none may be
refused, and none may come back empty unless listed below with the reason. Grafana itself is
not run: no package registry reachable here has its server (docs/dashboards.md)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import openai
import pytest

from tests.dashboard_queries import (
    ALL,
    Target,
    Window,
    label_values_query,
    query_variables,
    substitute,
    targets,
    variable_text,
    window,
)
from tests.prometheus_kit import (
    DEPLOY_CONFIG,
    PROMTOOL,
    Prometheus,
    PromQLError,
    missing_binaries,
    running,
    scratch_config,
)
from tests.system import System, wait_ready

pytestmark = pytest.mark.integration
needs_prometheus = pytest.mark.skipif(
    bool(missing_binaries()),
    reason=f"{' and '.join(missing_binaries())} not installed: `make prometheus` installs "
    "Debian's prometheus package",
)

DASHBOARDS = sorted((DEPLOY_CONFIG.parents[1] / "grafana" / "dashboards").glob("*.json"))
SCRAPE_S = 1  # stands for the datasource's timeInterval too, as the provisioned one sets it
MAX_DATA_POINTS = 1000  # a panel about 1000 pixels wide
MODEL = "dashlive"

_NO_GPU = "this machine has no GPU: the agent exports no GPU series"
_NO_KV = (
    "KV-event routing needs an engine that publishes KV events (vLLM, SGLang): not the stand-in"
)
_NO_PUBLISHER = "no external engine's KV-event publisher is configured"
_NO_FAULT = "nothing failed upstream in this run"
# Panels that stay empty on this machine with this traffic, and why. A panel not listed must
# return at least one series.
MAY_BE_EMPTY: dict[str, dict[str, str]] = {
    "llmgw-gateway.json": {
        "Upstream errors/s by model and reason, and retries/s / A": _NO_FAULT,
        "Upstream errors/s by model and reason, and retries/s / B": _NO_FAULT,
        "Cached prompt tokens/s: predicted vs reported / A": _NO_KV,
        "Reported / predicted cached tokens / A": _NO_KV,
        "Prediction error (predicted minus reported tokens) / A": _NO_KV,
        "Prompt tokenization for KV routing / A": _NO_KV,
        "Prompt tokenization for KV routing / B": _NO_KV,
        "KV feeds connected, by node / A": _NO_KV,
        **{f"KV feed lines/s and trouble/s, by node / {ref}": _NO_KV for ref in "ABCDEFGH"},
        "KV index blocks, by replica / A": _NO_KV,
        "External KV publishers connected / A": _NO_PUBLISHER,
        **{
            f"External KV publishers: batches/s and trouble/s / {ref}": _NO_PUBLISHER
            for ref in "ABCDEF"
        },
    },
    "llmgw-nodes.json": {
        "GPU utilisation / A": _NO_GPU,
        "GPU memory in use / A": _NO_GPU,
        "GPU temperature / A": _NO_GPU,
        "GPU power draw and limit / A": _NO_GPU,
        "GPU power draw and limit / B": _NO_GPU,
        "Uncorrected and corrected ECC errors / A": _NO_GPU,
        "Retired pages and remapped rows / A": _NO_GPU,
        "Retired pages and remapped rows / B": _NO_GPU,
        "Retired pages and remapped rows / C": _NO_GPU,
        "Clocks held down, by reason / A": _NO_GPU,
    },
}


@needs_prometheus
def test_promtool_accepts_the_deployed_config() -> None:
    checked = subprocess.run(
        [PROMTOOL, "check", "config", str(DEPLOY_CONFIG)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # No rules files today; promtool's check above also checks any that the config lists.
    assert "rule_files" not in DEPLOY_CONFIG.read_text()


def test_the_allowed_empty_panels_exist() -> None:
    # A renamed panel must not leave a stale allowance that excuses nothing.
    for path in DASHBOARDS:
        wheres = {target.where for target in targets(json.loads(path.read_text()))}
        assert set(MAY_BE_EMPTY[path.name]) <= wheres, path.name


def _drive_traffic(system: System) -> None:
    """Plain and streamed chat (requests, tokens, durations, TTFT), a 404 for an unknown model
    (the not-2xx share), a wrong key (auth failures) and a key over its rpm (quota)."""
    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)
    messages = [{"role": "user", "content": "hello dashboards"}]
    for _ in range(3):
        client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True)  # type: ignore[arg-type]
        for _chunk in stream:
            pass
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=messages)  # type: ignore[arg-type]
    wrong = openai.OpenAI(base_url=system.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    key = system.cli("key", "create", "dash-rpm", "--rpm", "1").stdout.strip().split()[-1]
    limited = openai.OpenAI(base_url=system.base_url, api_key=key, max_retries=0)
    deadline = time.monotonic() + 20
    while True:  # the gateway takes up a new key within a moment
        try:
            limited.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
            limited.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        except openai.RateLimitError:
            return
        except openai.AuthenticationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _options(prometheus: Prometheus, variable: dict[str, object]) -> list[str]:
    """A label_values variable's options, asked of Prometheus as Grafana asks."""
    metric, label = label_values_query(variable)
    values: list[str] = prometheus.api(f"label/{label}/values", **{"match[]": metric})
    return values


def _run(
    prometheus: Prometheus, target: Target, expr: str, start: float, end: float, step: float
) -> int:
    """How many series the query returns, as Grafana would ask for them."""
    if target.instant:
        return len(prometheus.api("query", query=expr, time=end)["result"])
    result = prometheus.api("query_range", query=expr, start=start, end=end, step=step)
    return len(result["result"])


def _series_present(prometheus: Prometheus, *metrics: str) -> bool:
    return all(prometheus.api("query", query=metric)["result"] for metric in metrics)


def _ask_every_panel(
    prometheus: Prometheus, span: Window, start: float, end: float, one_value: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """Every panel target of every dashboard, asked of Prometheus twice: as the dashboard opens
    (All) and narrowed to `one_value` of each variable. The queries Prometheus refused, with
    its words; those that came back empty though MAY_BE_EMPTY does not excuse them."""
    refused: dict[str, str] = {}
    empty: list[str] = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        variables = query_variables(dashboard)
        options = {name: _options(prometheus, v) for name, v in variables.items()}
        assert all(options.values()), f"{path.name}: a variable has no values: {options}"
        for choice in ("All", "one"):
            values = {}
            for name, found in options.items():
                picked = [ALL] if choice == "All" else [one_value[name]]
                assert set(picked) <= {ALL, *found}, f"{path.name}: ${name} offers {found}"
                values[name] = variable_text(variables[name], picked, found)
            for target in targets(dashboard):
                where = f"{path.name}: {target.where} ({choice})"
                expr = substitute(target.expr, values, span)
                try:
                    count = _run(prometheus, target, expr, start, end, span.interval_s)
                except PromQLError as err:
                    refused[where] = f"{err} in {expr}"
                    continue
                if count == 0 and target.where not in MAY_BE_EMPTY[path.name]:
                    empty.append(f"{where}: {expr}")
    return refused, empty


@needs_prometheus
async def test_every_panel_query_runs_on_real_prometheus(
    system: System, weights: Path, tmp_path: Path
) -> None:
    system.cli("model", "add", MODEL, "--weights", str(weights), "--cpu-cores", "1")
    await wait_ready(system, MODEL, 1)
    jobs = {
        "llmgw-gateway": f"127.0.0.1:{system.admin_port}",
        "llmgw-agents": f"127.0.0.1:{system.agent_metrics_port}",
    }
    with running(tmp_path / "prometheus", scratch_config(jobs, SCRAPE_S)) as prometheus:
        start = time.time()
        _drive_traffic(system)
        deadline = time.monotonic() + 20
        wanted = [
            *("llmgw_quota_rejections_total", "llmgw_auth_failures_total"),
            *("llmgw_time_to_first_token_seconds_bucket", "llmgw_node_engine_metrics_up"),
        ]
        while not _series_present(prometheus, *wanted):
            assert time.monotonic() < deadline, (prometheus.targets_up(), prometheus.last_errors())
            time.sleep(0.5)
        assert prometheus.targets_up() == {"llmgw-gateway": True, "llmgw-agents": True}
        # A few more scrapes after the traffic, so each rate() has samples on both sides.
        time.sleep(4 * SCRAPE_S + 1)
        end = time.time()
        span = window(end - start, MAX_DATA_POINTS, SCRAPE_S)

        refused, empty = _ask_every_panel(
            prometheus, span, start, end, {"model": MODEL, "node": system.node}
        )
    assert refused == {}
    assert empty == []
