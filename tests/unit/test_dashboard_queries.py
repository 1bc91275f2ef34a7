"""Grafana's variable substitution as tests/dashboard_queries.py does it for the live
dashboard test: the intervals Grafana derives, the text of a variable's values, and refusals
of anything it does not know."""

import json
from pathlib import Path

import pytest

from tests.dashboard_queries import (
    ALL,
    Target,
    UnknownVariable,
    Window,
    label_values_query,
    query_variables,
    round_interval_ms,
    substitute,
    targets,
    variable_text,
    window,
)
from tests.prometheus_kit import scratch_config

DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"
MULTI = {"name": "model", "multi": True, "includeAll": True, "allValue": ".*"}
SPAN = Window(range_s=3600, interval_s=15, rate_interval_s=60)


@pytest.mark.parametrize(
    ("interval_ms", "rounded"),
    [
        *[(5, 10), (900, 1000), (3_600, 5_000), (12_000, 10_000), (16_000, 15_000)],
        *[(60_000, 60_000), (100_000, 120_000), (4_000_000, 3_600_000), (1e12, 31_536_000_000)],
    ],
)
def test_intervals_round_as_grafana_rounds_them(interval_ms: float, rounded: int) -> None:
    assert round_interval_ms(interval_ms) == rounded


def test_the_last_hour_on_a_wide_panel_scraped_every_15s() -> None:
    # 3600 s over 1000 points is 3.6 s, rounded to 5 s, raised to the 15 s scrape interval;
    # $__rate_interval is then max(15 + 15, 4 x 15).
    assert window(3600, 1000, 15) == Window(3600, 15, 60)


def test_a_long_range_takes_a_longer_interval_and_rate_interval() -> None:
    # 24 h over 1000 points is 86.4 s, rounded to 1 m: rate interval 60 + 15.
    assert window(86_400, 1000, 15) == Window(86_400, 60, 75)


def test_a_fast_scrape_keeps_four_scrapes_in_each_rate() -> None:
    assert window(60, 1000, 1) == Window(60, 1, 4)


def test_window_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        window(0, 1000, 15)


def test_builtins_are_substituted() -> None:
    expr = "increase(x[$__range]) + rate(y[$__rate_interval]) + z[${__interval}] + $__range_s"
    assert substitute(expr, {}, SPAN) == "increase(x[3600s]) + rate(y[60s]) + z[15s] + 3600"


def test_a_sub_second_interval_is_in_milliseconds() -> None:
    assert substitute("$__interval $__interval_ms", {}, Window(60, 0.5, 4)) == "500ms 500"


def test_all_is_the_variables_all_value_as_it_stands() -> None:
    assert variable_text(MULTI, [ALL], ["a", "b"]) == ".*"
    without_all_value = {**MULTI, "allValue": None}
    assert variable_text(without_all_value, [ALL], ["a.b", "c"]) == r"(a\\.b|c)"


def test_selected_values_are_regex_escaped_for_a_promql_string() -> None:
    assert variable_text(MULTI, ["llama-3.1:8b"], []) == r"llama-3\\.1:8b"
    assert variable_text(MULTI, ["a", "b(1)"], []) == r"(a|b\\(1\\))"


def test_a_single_value_variable_is_not_regex_escaped() -> None:
    single = {"name": "node", "multi": False, "includeAll": False}
    assert variable_text(single, ["n.1"], []) == "n.1"
    with pytest.raises(ValueError, match="one value only"):
        variable_text(single, ["a", "b"], [])
    with pytest.raises(ValueError, match="All is not offered"):
        variable_text(single, [ALL], ["a"])


def test_dashboard_variables_are_substituted_in_both_spellings() -> None:
    expr = 'rate(m{model=~"$model", node=~"${node}"}[$__rate_interval])'
    values = {"model": ".*", "node": r"(a|b)"}
    assert substitute(expr, values, SPAN) == 'rate(m{model=~".*", node=~"(a|b)"}[60s])'


def test_an_unknown_variable_is_refused_by_name() -> None:
    with pytest.raises(UnknownVariable, match=r"\$replica"):
        substitute('m{replica="$replica"}', {"model": ".*"}, SPAN)
    with pytest.raises(UnknownVariable, match="formats"):
        substitute("${model:csv}", {"model": ".*"}, SPAN)
    with pytest.raises(UnknownVariable, match=r"\[\[variable\]\]"):
        substitute("m{model=~'[[model]]'}", {"model": ".*"}, SPAN)


def test_label_values_variables_name_their_metric_and_label() -> None:
    variable = {"name": "model", "query": {"query": "label_values(llmgw_requests_total, model)"}}
    assert label_values_query(variable) == ("llmgw_requests_total", "model")
    with pytest.raises(ValueError, match="not a label_values"):
        label_values_query({"name": "x", "query": "up"})


def test_targets_include_rows_nested_panels_and_instant_queries() -> None:
    dashboard = {
        "panels": [
            {"title": "a", "targets": [{"refId": "A", "expr": "x"}]},
            {
                "title": "row",
                "type": "row",
                "panels": [
                    {"title": "b", "targets": [{"refId": "A", "expr": "y", "instant": True}]}
                ],
            },
            {"title": "c", "targets": [{"refId": "B", "expr": "z"}]},
        ]
    }
    assert targets(dashboard) == [
        Target("a", "A", "x", False),
        Target("b", "A", "y", True),
        Target("c", "B", "z", False),
    ]


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.name)
def test_every_deployed_query_substitutes_completely(path: Path) -> None:
    # Every variable the dashboards use is one this substitution knows.
    dashboard = json.loads(path.read_text())
    values = {
        name: variable_text(v, [ALL], ["x"]) for name, v in query_variables(dashboard).items()
    }
    found = targets(dashboard)
    assert found
    for target in found:
        assert "$" not in substitute(target.expr, values, SPAN), target.where


def test_the_scratch_prometheus_config_keeps_the_deployed_jobs() -> None:
    config = scratch_config({"llmgw-gateway": "127.0.0.1:20001"}, 1)
    assert config["global"]["scrape_interval"] == "1s"
    (job,) = config["scrape_configs"]
    assert (job["job_name"], job["metrics_path"]) == ("llmgw-gateway", "/metrics")
    assert job["static_configs"] == [{"targets": ["127.0.0.1:20001"]}]
    with pytest.raises(ValueError, match="no such job"):
        scratch_config({"llmgw-engines": "127.0.0.1:1"}, 1)
