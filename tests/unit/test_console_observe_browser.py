"""The console's Requests and Charts pages in headless Chromium, against the real gateway app
(the console stand-in's cluster) routing real requests to the llama-server stand-in: the request
log with its filters, a logged prompt for the key that asks for it, and the charts drawn as
inline SVG with their axes. Each test fails on any error in the browser's console."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from store import KeyLimits
from tests.browser_kit import (
    NEEDS_BROWSER,
    all_css,
    by_css,
    click,
    console_errors,
    fill,
    screenshot,
    until,
)
from tests.console_kit import ConsoleGateway, console_gateway, open_page
from tests.gateway_kit import MODEL, recording_standin_thread, route
from workflows.contracts import RoutingTable

pytestmark = NEEDS_BROWSER


@dataclass
class Served:
    gateway: ConsoleGateway
    stream_id: str  # the x-request-id of a streamed request
    missing_id: str  # of a request for a model that does not exist


def _send(client: httpx.Client, api_key: str, body: dict[str, Any]) -> httpx.Response:
    """Sent until the gateway knows the new key (it rereads its keys every 0.1 s)."""
    deadline = time.monotonic() + 10
    while True:
        response = client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {api_key}"}
        )
        if response.status_code != 401 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("observe")
    with recording_standin_thread(tmp) as engine, console_gateway(tmp) as gateway:
        gateway.catalog.table = RoutingTable(version=2, routes=[route("smol-0", engine.url)])
        _, plain = gateway.call(gateway.store.create_key("web-app"))
        _, audited = gateway.call(
            gateway.store.create_key("audited", limits=KeyLimits(log_prompts=True))
        )
        with httpx.Client(base_url=gateway.url, timeout=15, trust_env=False) as client:
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}]}
            # The first until the routing table names the replica.
            deadline = time.monotonic() + 10
            while _send(client, plain, chat).status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            stream_id = ""
            for i in range(6):
                words = f"tell me about otters, part {i}"
                body = {**chat, "stream": True, "messages": [{"role": "user", "content": words}]}
                response = _send(client, plain, body)
                assert response.status_code == 200, response.text
                stream_id = response.headers["x-request-id"]
            secret = {"role": "user", "content": "the audited question"}
            assert _send(client, audited, {**chat, "messages": [secret]}).status_code == 200
            missing = _send(client, plain, {**chat, "model": "no-such-model"})
            assert missing.status_code == 404
        yield Served(gateway, stream_id, missing.headers["x-request-id"])


def choose(browser: Any, selector: str, value: str) -> None:
    """Pick an option of a select the live updates may be drawing again."""
    from selenium.webdriver.support.ui import Select

    def chosen() -> bool:
        Select(by_css(browser, selector)).select_by_value(value)
        return True

    until(chosen, selector)


ROWS_TEXT = (
    "return [...document.querySelectorAll('table[data-table=\"requests\"] tbody tr')]"
    ".map(row => row.innerText)"
)


# One figure read in one step in the page: the charts are drawn again on every poll (their
# buckets move with the clock), and element by element through WebDriver met figures already
# replaced on a loaded machine.
FIGURE = """
const figure = document.querySelector(`figure[data-figure="${arguments[0]}"]`);
if (!figure) return null;
const svg = figure.querySelector("svg");
return {
  text: figure.innerText,
  axis: [...figure.querySelectorAll("text.axis")].map((t) => t.textContent),
  line: figure.querySelector("path.series")?.getAttribute("d") ?? "",
  lines: [...figure.querySelectorAll("path.series")].map((p) => p.getAttribute("d") ?? ""),
  dots: figure.querySelectorAll("circle.dot").length,
  label: svg?.getAttribute("aria-label") ?? "",
};
"""


def figure(browser: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = until(lambda: browser.execute_script(FIGURE, name), f"chart {name}")
    return found


def _rows(browser: Any) -> list[str]:
    """The rows' text read in one step in the page: the table is drawn again on every poll, and
    reading row by row through WebDriver met rows already replaced (stale elements) on a loaded
    machine, until the wait gave up."""
    rows: list[str] = browser.execute_script(ROWS_TEXT)
    return rows


def test_the_request_log_shows_each_request_and_filters_it(
    served: Served, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, served.gateway, "requests")
    # `until` returns only a truthy answer: here the rows, never False.
    rows = cast(
        list[str], until(lambda: len(_rows(browser)) >= 9 and _rows(browser), "the requests")
    )
    newest_stream = next(row for row in rows if served.stream_id in row)
    assert all(text in newest_stream for text in ("web-app", MODEL, "smol-0 on node-a", "200"))
    assert " ms" in newest_stream, "a stream shows its time to first token"
    audited = next(row for row in rows if "audited" in row)
    assert "not kept" not in audited, "the key that logs prompts has its prompt kept"
    assert sum("not kept" in row for row in rows) == len(rows) - 1
    by_css(browser, 'table[data-table="requests"] details summary').click()
    assert "the audited question" in by_css(browser, "pre.prompt").text
    screenshot(browser, "requests", tmp_path)

    choose(browser, "select#status", "4xx")
    # The 404, and any 401 a request got before the gateway had read its new key.
    refused = cast(
        list[str],
        until(
            lambda: all(re.search(r"(^|\s)40\d", row) for row in _rows(browser)) and _rows(browser),
            "the 4xx filter",
        ),
    )
    (missing,) = [row for row in refused if served.missing_id in row]
    assert "404 model_not_found" in missing
    choose(browser, "select#status", "")
    choose(browser, "select#key", "audited")
    until(lambda: len(_rows(browser)) == 1, "the key filter")
    choose(browser, "select#key", "")
    # The filter's change reads and draws the page again, the field included: typed into only
    # once that is done, as an operator would see it.
    until(lambda: len(_rows(browser)) > 1, "the key filter cleared")
    fill(browser, "input#min_ttft_ms", "600000")
    click(browser, "#request-filters button[type=submit]")
    until(lambda: by_css(browser, 'p[data-table="requests"]'), "no request that slow")
    assert console_errors(browser) == []


def test_the_charts_draw_each_figure_with_its_axes(
    served: Served, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, served.gateway, "charts")
    until(lambda: len(all_css(browser, "figure[data-figure]")) == 6, "six charts")
    requests = figure(browser, "requests")
    assert "Requests a second (req/s)" in requests["text"]
    assert "req/s" in requests["axis"], "the y axis names its unit"
    assert any("last 60 min, 10 s buckets" in t for t in requests["axis"]), requests["axis"]
    assert requests["line"].startswith("M"), "the requests made are drawn"
    ttft = figure(browser, "ttft")
    assert "latest p50" in ttft["label"]
    assert " ms" in ttft["label"]
    tokens = figure(browser, "tokens")["text"]
    assert "prompt" in tokens
    assert "completion" in tokens
    # TTFT is drawn, each run of buckets as a segment of the line and each bucket alone as a dot
    # (a line needs two). The streams may fall in one 10 s bucket or straddle two.
    segments = [segment for line in ttft["lines"] for segment in line.split("M")[1:]]
    assert segments, "the streams' time to first token is drawn"
    assert ttft["dots"] == sum("L" not in segment for segment in segments), ttft
    screenshot(browser, "charts", tmp_path)

    choose(browser, "select#series", "key:audited")
    until(
        lambda: (
            "audited" in by_css(browser, "select#series").get_attribute("value")
            and "highest 0.1 req/s"
            in by_css(browser, 'svg[data-chart="requests"]').get_attribute("aria-label")
        ),
        "the audited key's one request",
    )
    choose(browser, "select#minutes", "15")
    until(
        lambda: "last 15 min" in by_css(browser, 'figure[data-figure="requests"]').text,
        "the shorter range",
    )
    assert console_errors(browser) == []
