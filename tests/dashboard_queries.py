"""The PromQL a Grafana dashboard sends, worked out without Grafana: every panel target of a
dashboard JSON, and its text with Grafana's variables substituted as Grafana's Prometheus
datasource does before it asks Prometheus.

Only what llmgw's dashboards use is covered: dashboard variables (`$name`, `${name}`) of type
query, and the built-ins `$__interval`, `$__interval_ms`, `$__rate_interval`, `$__range`,
`$__range_s` and `$__range_ms`. Anything else is refused by name rather than sent on as
text, so a new variable cannot slip past the live test as an unsubstituted `$x`.

What Grafana does, as its documentation gives it:
- `$__interval` is the dashboard's time range over the panel's max data points (by default
  its width in pixels), rounded to one of Grafana's round intervals, and never below the
  datasource's scrape interval (`timeInterval`). It is also the query_range step.
- `$__rate_interval` is max($__interval + scrape interval, 4 x scrape interval), in seconds.
- `$__range` is the time range in whole seconds, as `<n>s`.
- A multi-value or include-All variable's values are regex-escaped (they go into `=~`);
  several become `(a|b)`; All is the variable's `allValue` as it stands, else every value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Grafana's round intervals (rangeutil's roundInterval): an interval in milliseconds below
# the first figure rounds to the second.
_ROUND_MS: tuple[tuple[float, int], ...] = (
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1_500, 1_000),
    (3_500, 2_000),
    (7_500, 5_000),
    (12_500, 10_000),
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
    (604_800_000, 86_400_000),
    (1_814_400_000, 604_800_000),
    (3_628_800_000, 2_592_000_000),
)
_YEAR_MS = 31_536_000_000

# `$name`, `${name}` and `${name:format}`; Grafana's older `[[name]]` is refused below.
_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)")
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]'])")

ALL = "$__all"


class UnknownVariable(ValueError):
    """A query names a variable the dashboard does not define and Grafana has no built-in of."""


@dataclass(frozen=True)
class Target:
    """One query a panel sends: where it is, its PromQL as written, and whether Grafana asks
    for an instant value (a bar gauge over the range) or a range of points."""

    panel: str
    ref_id: str
    expr: str
    instant: bool

    @property
    def where(self) -> str:
        return f"{self.panel} / {self.ref_id}"


@dataclass(frozen=True)
class Window:
    """The time a dashboard shows and how Grafana divides it for a panel: `interval_s` is
    $__interval (and the query_range step), `rate_interval_s` is $__rate_interval."""

    range_s: int
    interval_s: float
    rate_interval_s: int


def round_interval_ms(interval_ms: float) -> int:
    for below, rounded in _ROUND_MS:
        if interval_ms < below:
            return rounded
    return _YEAR_MS


def window(range_s: float, max_data_points: int, scrape_interval_s: int) -> Window:
    """Grafana's $__interval and $__rate_interval for a panel `max_data_points` wide showing
    `range_s` seconds of a datasource scraped every `scrape_interval_s`."""
    if range_s <= 0 or max_data_points <= 0 or scrape_interval_s <= 0:
        raise ValueError("the range, the data points and the scrape interval must be positive")
    interval_ms = max(round_interval_ms(range_s * 1000 / max_data_points), scrape_interval_s * 1000)
    interval_s = interval_ms / 1000
    rate = max(interval_s + scrape_interval_s, 4 * scrape_interval_s)
    return Window(round(range_s), interval_s, int(rate))


def targets(dashboard: Mapping[str, Any]) -> list[Target]:
    """Every panel target, rows' nested panels included, in the dashboard's order."""
    found = []
    pending = list(dashboard.get("panels", []))
    while pending:
        panel = pending.pop(0)
        pending[:0] = panel.get("panels", [])
        for target in panel.get("targets", []):
            instant = bool(target.get("instant")) and not target.get("range")
            found.append(Target(panel["title"], target["refId"], target["expr"], instant))
    return found


def query_variables(dashboard: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The dashboard's query variables by name (the datasource variable picks no values)."""
    return {
        variable["name"]: variable
        for variable in dashboard.get("templating", {}).get("list", [])
        if variable.get("type") == "query"
    }


def label_values_query(variable: Mapping[str, Any]) -> tuple[str, str]:
    """(metric, label) of a `label_values(metric, label)` variable: Grafana asks Prometheus
    for that label's values on the series of that selector."""
    query = variable.get("query")
    if isinstance(query, Mapping):
        query = query.get("query")
    match = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*", str(query or ""))
    if match is None:
        raise ValueError(f"${variable.get('name')}: not a label_values(metric, label) query")
    return match.group(1), match.group(2)


def _regex_escape(value: str) -> str:
    # Escaped for the regex, then the backslash doubled for PromQL's double-quoted string.
    return _REGEX_SPECIAL.sub(r"\\\\\1", value)


def variable_text(
    variable: Mapping[str, Any], selected: Sequence[str], options: Sequence[str]
) -> str:
    """What Grafana puts in place of a variable with these values selected (`ALL` for All)."""
    if not selected:
        raise ValueError(f"${variable['name']}: no value selected")
    if list(selected) == [ALL]:
        if not variable.get("includeAll"):
            raise ValueError(f"${variable['name']}: All is not offered")
        if variable.get("allValue") is not None:
            return str(variable["allValue"])
        selected = options
    if not (variable.get("multi") or variable.get("includeAll")):
        if len(selected) != 1:
            raise ValueError(f"${variable['name']}: one value only")
        return selected[0].replace("\\", "\\\\").replace("'", "\\'")
    escaped = [_regex_escape(value) for value in selected]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _builtins(span: Window) -> dict[str, str]:
    interval = f"{span.interval_s:g}s" if span.interval_s >= 1 else f"{span.interval_s * 1000:g}ms"
    return {
        "__interval": interval,
        "__interval_ms": f"{span.interval_s * 1000:g}",
        "__rate_interval": f"{span.rate_interval_s}s",
        "__range": f"{span.range_s}s",
        "__range_s": str(span.range_s),
        "__range_ms": str(span.range_s * 1000),
    }


def substitute(expr: str, values: Mapping[str, str], span: Window) -> str:
    """`expr` with each dashboard variable replaced by its text in `values` (from
    variable_text) and each built-in by its figure for `span`."""
    if "[[" in expr:
        raise UnknownVariable(f"the deprecated [[variable]] syntax in {expr!r}")
    known = {**_builtins(span), **values}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if match.group(2):
            raise UnknownVariable(f"${{{name}:{match.group(2)}}}: formats are not handled here")
        if name not in known:
            raise UnknownVariable(f"${name} in {expr!r}")
        return known[name]

    return _VARIABLE.sub(replace, expr)


def variables_used(expr: str) -> Iterator[str]:
    for match in _VARIABLE.finditer(expr):
        yield match.group(1) or match.group(3)
