"""The console's Playground page in headless Chromium, against the real gateway app (the console
stand-in's cluster) routing to the llama-server stand-in: an answer streamed into the page with
the request log's facts and the key's budget, and the API's own error for a missing or wrong
key. Fails on any error in the browser's console. The same page against the real demo model
and llama-server: tests/e2e/test_console_live.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.support.ui import Select

from store import KeyLimits
from tests.browser_kit import (
    NEEDS_BROWSER,
    by_css,
    chromium,
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

BUDGET = 100_000
# The browser's console logs a failed fetch as an error; these tests provoke 401s on purpose.
PROVOKED = ("playground/chat/completions - Failed to load resource",)


@dataclass
class Served:
    gateway: ConsoleGateway
    api_key: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("playground")
    with recording_standin_thread(tmp) as engine, console_gateway(tmp) as gateway:
        replica = route("smol-0", engine.url).model_copy(update={"adapters": ["pirate"]})
        gateway.catalog.table = RoutingTable(version=2, routes=[replica])
        _, secret = gateway.call(
            gateway.store.create_key("playground", limits=KeyLimits(token_budget=BUDGET))
        )
        # Usable once the gateway has reread its keys and its routes.
        with httpx.Client(base_url=gateway.url, timeout=15, trust_env=False) as client:
            deadline = time.monotonic() + 10
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            while time.monotonic() < deadline:
                answer = client.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
                )
                if answer.status_code == 200:
                    break
                time.sleep(0.1)
            assert answer.status_code == 200, answer.text
        yield Served(gateway, secret)


def _fact(driver: object, name: str) -> str:
    return str(by_css(driver, f'#pg-facts [data-fact="{name}"]').text)


def test_a_prompt_streams_and_shows_its_route_tokens_and_cost(
    served: Served, tmp_path: Path
) -> None:
    gateway = served.gateway
    with chromium() as driver:
        open_page(driver, gateway, "playground")
        until(lambda: MODEL in by_css(driver, "#playground-data").text, "the models on offer")
        until(lambda: Select(by_css(driver, "#pg-model")).first_selected_option.text == MODEL, "m")
        adapters = [o.text for o in Select(by_css(driver, "#pg-adapter")).options]
        assert adapters == ["none", "pirate"]
        fill(driver, "#pg-key", served.api_key)
        fill(driver, "#pg-prompt", "Tell me about otters")
        click(driver, "#playground button[type=submit]")
        until(lambda: _fact(driver, "replica"), "the request's facts", 30)
        assert by_css(driver, "#pg-answer").text.strip()
        assert by_css(driver, "#pg-error").get_attribute("hidden") is not None
        assert _fact(driver, "replica") == "smol-0 on node-a"
        assert _fact(driver, "status") == "200"
        assert _fact(driver, "key") == "playground"
        assert _fact(driver, "routing") != "\N{EN DASH}"  # what the page shows for none
        assert _fact(driver, "ttft").endswith(" ms")
        assert _fact(driver, "browser-ttft").endswith(" ms")
        request_id = _fact(driver, "request")
        record = gateway.call(_record(gateway, request_id))
        billed = record["prompt_tokens"] + record["completion_tokens"]
        assert _fact(driver, "tokens").startswith(
            f"{record['prompt_tokens']:,} / {record['completion_tokens']:,}"
        )
        assert _fact(driver, "billed") == f"{billed:,} tokens"
        # The page waited for the store's usage to hold this request; the warm-up came before.
        used = gateway.call(_used_today(gateway, record["key_id"]))
        assert _fact(driver, "budget") == f"{BUDGET - used:,} of {BUDGET:,} tokens left this day"
        assert used >= billed
        screenshot(driver, "playground", tmp_path)
        assert console_errors(driver) == []


def test_a_missing_or_wrong_key_shows_the_apis_message(served: Served) -> None:
    with chromium() as driver:
        open_page(driver, served.gateway, "playground")
        until(lambda: MODEL in by_css(driver, "#playground-data").text, "the models on offer")
        fill(driver, "#pg-prompt", "Hello")
        click(driver, "#playground button[type=submit]")
        error = until(lambda: by_css(driver, "#pg-error").text, "the error")
        assert "API key" in error
        until(lambda: _fact(driver, "status") == "401 invalid_api_key", "the logged refusal")
        fill(driver, "#pg-key", "sk-llmgw-wrong")
        click(driver, "#playground button[type=submit]")
        until(lambda: _fact(driver, "status") == "401 invalid_api_key", "the second refusal")
        assert by_css(driver, "#pg-error").text == error
        assert by_css(driver, "#pg-answer").text == ""
        assert console_errors(driver, PROVOKED) == []
        # Nothing of the key is left in the page's storage or its URL.
        assert driver.execute_script("return localStorage.length + sessionStorage.length") == 0
        assert "sk-llmgw" not in driver.current_url


async def _record(gateway: ConsoleGateway, request_id: str) -> dict[str, object]:
    log = gateway.state.request_log
    assert log is not None
    from gateway.observe.request_log import RequestFilter

    (record,) = log.query(RequestFilter(request_id=request_id), 1)
    return record.as_dict()


async def _used_today(gateway: ConsoleGateway, key_id: object) -> int:
    from datetime import UTC, datetime

    today = datetime.now(UTC).date()
    rows = await gateway.store.usage(key_id=str(key_id), since=today)
    return sum(r.prompt_tokens + r.completion_tokens for r in rows)
