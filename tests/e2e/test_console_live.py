"""The web console against a live `llmgw up` serving the real demo model through the real
llama-server, in headless Chromium: what an operator checks first. One `llmgw up` for the whole
module (it is the slow part); every step fails on an error in the browser's console.

The first run on a machine builds llama-server from source (cached afterwards); the fixture
allows for that, as tests/e2e/test_smollm2.py's does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.browser_kit import (
    NEEDS_BROWSER,
    chromium,
    console_errors,
    screenshot,
    until,
)
from tests.system import System, running_system, wait_ready
from workers.demo import DEMO_MODEL

pytestmark = [
    pytest.mark.e2e,
    NEEDS_BROWSER,
]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    yield from running_system(tmp_path_factory.mktemp("state"))


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def show(driver: Any, console: str, page: str) -> None:
    driver.get(f"{console}#{page}")
    until(lambda: "Updated" in css(driver, "#freshness").text, "its first update", 30)


def ask(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
    return reply.choices[0].message.content or ""


async def first_answer(client: openai.OpenAI) -> str:
    """A new key works once the gateway's key refresh (every second) has read it."""
    for _ in range(50):
        try:
            return await asyncio.to_thread(ask, client)
        except openai.AuthenticationError:
            await asyncio.sleep(0.2)
    raise AssertionError("the key made on the page was never accepted")


async def test_the_console_on_a_live_cluster(system: System, tmp_path: Path) -> None:
    (replica,) = await wait_ready(system, DEMO_MODEL, 1, timeout=300)
    inventory = (await system.ledger()).nodes[system.node].inventory
    engine_pid = system.engine_pid(replica)
    console = f"http://127.0.0.1:{system.admin_port}/admin/console/"

    with chromium() as browser:
        # The demo replica, ready, on the overview and its model's page.
        show(browser, console, "overview")
        row = until(
            lambda: next(
                r for r in browser.find_elements("css selector", "tr") if replica in r.text
            ),
            "the demo replica",
        )
        assert "ready" in row.text
        assert system.node in row.text
        screenshot(browser, "live-overview", tmp_path)
        show(browser, console, "models")
        model = until(lambda: css(browser, f'article[data-model="{DEMO_MODEL}"]'), "the model")
        assert "1 of 1 replica(s) ready" in model.text
        screenshot(browser, "live-models", tmp_path)

        # The node's CPU and memory as its agent discovered them.
        show(browser, console, "nodes")
        node = until(lambda: css(browser, f'article[data-node="{system.node}"]'), "the node")
        cpu = css(node, '[data-fact="cpu"]').text
        assert cpu.startswith(f"{inventory.cpu_cores} cores")
        assert css(node, '[data-fact="memory"]').text == f"{inventory.memory_mb:,} MB"
        assert css(node, '[data-fact="placeable"]').text == "yes"
        screenshot(browser, "live-nodes", tmp_path)
        assert console_errors(browser) == []

        # A key made on the page works with the openai client.
        show(browser, console, "keys")
        css(browser, "#key-name").send_keys("made-in-the-console")
        css(browser, "#key-models").send_keys(DEMO_MODEL)
        css(browser, "#create-key button[type=submit]").click()
        secret = until(lambda: css(browser, "#new-key-value").text, "the new key")
        client = openai.OpenAI(base_url=system.base_url, api_key=secret, max_retries=0)
        assert await first_answer(client)
        # Its use comes back to the page, per key, model and day.
        usage = 'table[data-table="usage"] tbody'
        row = until(
            lambda: next(
                r
                for r in css(browser, usage).find_elements("css selector", "tr")
                if "made-in-the-console" in r.text
            ),
            "the key's use",
            30,
        )
        _day, key_name, model_name, requests, prompt, _completion = row.text.split()
        assert (key_name, model_name, requests) == ("made-in-the-console", DEMO_MODEL, "1")
        assert int(prompt.replace(",", "")) > 0
        screenshot(browser, "live-keys", tmp_path)
        assert console_errors(browser) == []

        # The request's routing decision and its status, as this gateway counted them.
        show(browser, console, "routing")
        decisions = until(
            lambda: css(browser, 'table[data-table="decisions"]').text, "the decisions"
        )
        assert DEMO_MODEL in decisions
        statuses = css(browser, 'table[data-table="requests"]').text
        assert f"{DEMO_MODEL} 200" in statuses
        screenshot(browser, "live-routing", tmp_path)
        assert console_errors(browser) == []

        # A drain from the page: the only node is draining, yet its replica, with nowhere
        # else to go, keeps serving in the same engine until a successor is ready elsewhere.
        show(browser, console, "nodes")
        until(
            lambda: css(browser, f'button[data-key="drain:{system.node}"]').click() or True, "drain"
        )
        browser.switch_to.alert.accept()
        said = f"node {system.node}: drain"
        until(lambda: said in css(browser, "#said").text, "the drain's answer", 30)

        async def draining() -> bool:
            return (await system.ledger()).nodes[system.node].draining

        await system.until(draining, 30, "the node draining")
        until(
            lambda: "draining" in css(browser, f'article[data-node="{system.node}"] h3').text,
            "the node shown draining",
        )
        assert replica in await system.ready_replicas(DEMO_MODEL)
        assert await asyncio.to_thread(ask, client)
        assert system.engine_pid(replica) == engine_pid
        screenshot(browser, "live-draining", tmp_path)

        # Uncordoned from the page, the node takes replicas again.
        until(
            lambda: css(browser, f'button[data-key="uncordon:{system.node}"]').click() or True,
            "uncordon",
        )
        said = f"node {system.node}: uncordon"
        until(lambda: said in css(browser, "#said").text, "the uncordon's answer", 30)

        async def uncordoned() -> bool:
            return not (await system.ledger()).nodes[system.node].cordoned

        await system.until(uncordoned, 30, "the node uncordoned")
        until(
            lambda: (
                css(browser, f'article[data-node="{system.node}"] [data-fact="placeable"]').text
                == "yes"
            ),
            "the node placeable again",
        )
        assert await asyncio.to_thread(ask, client)
        assert console_errors(browser) == []


async def test_the_playground_streams_the_demo_model(system: System, tmp_path: Path) -> None:
    """A prompt sent from the Playground page with a key that has a budget: the real model's
    answer streamed into the page, then the replica, tokens and cost the gateway recorded."""
    (replica,) = await wait_ready(system, DEMO_MODEL, 1, timeout=300)
    created = system.cli("key", "create", "playground", "--budget", "100000")
    secret = created.stdout.strip().splitlines()[-1]
    client = openai.OpenAI(base_url=system.base_url, api_key=secret, max_retries=0)
    assert await first_answer(client)  # the gateway has read the new key
    console = f"http://127.0.0.1:{system.admin_port}/admin/console/"

    def fact(name: str) -> str:
        return str(css(browser, f'#pg-facts [data-fact="{name}"]').text)

    with chromium() as browser:
        show(browser, console, "playground")
        until(lambda: DEMO_MODEL in css(browser, "#playground-data").text, "the demo model")
        until(
            lambda: css(browser, "#pg-model option:checked").text == DEMO_MODEL, "the model picked"
        )
        # A wrong key first: the API's own message, nothing streamed.
        css(browser, "#pg-key").send_keys("sk-llmgw-wrong")
        css(browser, "#pg-prompt").send_keys("Say hello")
        css(browser, "#playground button[type=submit]").click()
        until(lambda: fact("status") == "401 invalid_api_key", "the refusal")
        assert "API key" in css(browser, "#pg-error").text
        assert console_errors(browser, ("playground/chat/completions",)) == []

        css(browser, "#pg-key").clear()
        css(browser, "#pg-key").send_keys(secret)
        css(browser, "#pg-max-tokens").clear()
        css(browser, "#pg-max-tokens").send_keys("16")
        css(browser, "#playground button[type=submit]").click()
        until(lambda: fact("status") == "200", "the answer's facts", 120)
        assert css(browser, "#pg-answer").text.strip(), "the model's words, streamed"
        assert css(browser, "#pg-error").get_attribute("hidden") is not None
        assert fact("replica") == f"{replica} on {system.node}"
        assert fact("routing") != "\N{EN DASH}"  # what the page shows for none
        assert fact("ttft").endswith(" ms")
        assert fact("browser-ttft").endswith(" ms")
        prompt, completion = (int(n.replace(",", "")) for n in fact("tokens").split()[::2][:2])
        assert prompt > 0
        assert 0 < completion <= 16
        assert fact("billed") == f"{prompt + completion:,} tokens"
        left = int(fact("budget").split()[0].replace(",", ""))
        assert left <= 100_000 - (prompt + completion)
        assert fact("budget").endswith("of 100,000 tokens left this day")
        screenshot(browser, "live-playground", tmp_path)
        assert console_errors(browser) == []
