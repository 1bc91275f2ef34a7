"""The web console in headless Chromium, served by the real gateway app with a real SQLite store
against the stand-in cluster (tests/console_standin.py: an NVL72 rack of 18 trays, an A100 in
MIG mode, a cordoned CPU node). Each test fails on any error in the browser's console: a
script error, a refusal by the page's Content-Security-Policy, a file that did not load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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
from tests.console_kit import (
    USAGE_DAYS,
    USAGE_KEY,
    ConsoleGateway,
    console_gateway,
    open_page,
    region,
)
from tests.console_standin import CPU_NODE, MIG_NODE, RACK, TEMPORAL_UI

pytestmark = NEEDS_BROWSER


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    with console_gateway(tmp_path_factory.mktemp("console")) as gateway:
        yield gateway


def test_every_page_shows_the_cluster_and_keyboard_reaches_each(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.keys import Keys

    open_page(browser, gateway, "overview")
    overview = until(lambda: region(browser, "overview") or None, "the overview")
    assert all(r in overview for r in ("deepseek-0", "deepseek-1", "qwen-0", "smol-0", "smol-1"))
    assert "no node has a free a100 MIG 3g.40gb" in overview  # the pending replica's reason
    screenshot(browser, "overview", tmp_path)

    # The pages by keyboard alone: the skip link first, then the navigation in order.
    body = by_css(browser, "body")
    body.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.text == "Skip to content"
    seen = []
    for _ in range(8):
        browser.switch_to.active_element.send_keys(Keys.TAB)
        seen.append(browser.switch_to.active_element.text)
    assert seen == [
        "Overview",
        "Nodes",
        "NVLink",
        "Models",
        "Installs",
        "Mirror & fetches",
        "Keys & usage",
        "Routing",
    ]
    browser.switch_to.active_element.send_keys(Keys.ENTER)  # Routing
    until(lambda: by_css(browser, "#page-routing").is_displayed(), "the routing page")
    assert by_css(browser, 'nav a[data-page="routing"]').get_attribute("aria-current") == "page"
    assert not by_css(browser, "#page-overview").is_displayed()
    assert console_errors(browser) == []


def test_nodes_show_gpus_mig_and_why_a_node_is_not_placeable(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "nodes")
    until(lambda: by_css(browser, f'article[data-node="{MIG_NODE}"]'), "the MIG node")
    mig = by_css(browser, f'article[data-node="{MIG_NODE}"]').text
    # The card in MIG mode with nothing carved is why it takes no new replica.
    assert "Not placeable because:" in mig
    assert "GPU 1 (a100-80g): MIG mode on with no instances carved" in mig
    assert all(text in mig for text in ("MIG 3g.40gb", "smol-0"))  # the replica's instance
    tray = by_css(browser, f'article[data-node="{RACK[0]}"]').text
    # The tray's recorded figures: class, memory, temperature and power per GPU.
    assert all(text in tray for text in ("gb200", "°C", " W", "deepseek-0"))
    cpu = by_css(browser, f'article[data-node="{CPU_NODE}"]')
    assert by_css(cpu, '[data-fact="cpu"]').text.startswith("32 cores")
    assert "cordoned: disk replacement" in cpu.text
    link = by_css(cpu, 'a[href*="/workflows/"]').get_attribute("href")
    assert link == f"{TEMPORAL_UI}/namespaces/default/workflows/node%3A{CPU_NODE}"
    screenshot(browser, "nodes", tmp_path)
    # The summary's link opens the node's own page, keyboard focus on its heading.
    click(browser, f'a[data-key="goto:{CPU_NODE}"]')
    until(
        lambda: browser.switch_to.active_element.get_attribute("id") == f"node-{CPU_NODE}",
        "the node's page focused",
    )
    assert by_css(browser, "#page-node").is_displayed()
    assert not by_css(browser, "#page-nodes").is_displayed()
    assert console_errors(browser) == []


def test_the_nvlink_view_draws_the_rack_and_the_replicas_spanning_it(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "nvlink")
    until(lambda: all_css(browser, ".rack .tray"), "the rack")
    (domain,) = all_css(browser, "figure.domain")
    assert "18 tray(s), 72 GPUs" in domain.text
    trays = all_css(domain, ".rack > li")
    assert [by_css(t, ".tray-name").text for t in trays] == RACK
    held = [len(all_css(t, ".gpu-cell:not(.free)")) for t in trays]
    assert held == [4] * 9 + [0] * 9  # deepseek-0 on 1-4, deepseek-1 on 5-8, qwen-0 on 9
    legend = by_css(domain, ".legend").text
    assert "deepseek-0: 4 tray(s), nvl72-tray-01, nvl72-tray-02, nvl72-tray-03" in legend
    # Screen readers hear each GPU's holder.
    first = by_css(trays[0], ".gpu-cell .sr-only").get_attribute("textContent")
    assert first == "GPU 0: deepseek-0"
    screenshot(browser, "nvlink", tmp_path)
    assert console_errors(browser) == []


def test_models_show_why_and_the_rolling_update_and_installs_their_progress(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "models")
    deepseek = until(lambda: by_css(browser, 'article[data-model="deepseek"]'), "deepseek")
    assert "rolling update: 1 of 2 replica(s) on the current profile" in deepseek.text
    click(browser, 'article[data-model="smol"] summary')
    smol = by_css(browser, 'article[data-model="smol"]')
    assert "profile 1 (vllm a100-80g-mig-3g.40gb x1): would go to a100-mig" in smol.text
    screenshot(browser, "models", tmp_path)

    open_page(browser, gateway, "installs")
    text = until(lambda: region(browser, "installs") or None, "installs")
    assert "building llama-server 45%" in text
    screenshot(browser, "installs", tmp_path)
    open_page(browser, gateway, "mirror")
    fetches = until(lambda: by_css(browser, 'table[data-table="fetches"]').text, "the fetches")
    assert "3.22 of 8.59 GB (37%)" in fetches
    assert "model-00002.safetensors" in fetches
    assert console_errors(browser) == []


def test_updates_arrive_without_a_reload(gateway: ConsoleGateway, browser: Any) -> None:
    open_page(browser, gateway, "overview")
    browser.execute_script("window.notReloaded = true")
    gateway.cluster.ledger.routes["deepseek-1"].state = gateway.cluster.ledger.routes[
        "qwen-0"
    ].state  # loading -> ready, as the replica would report it
    until(lambda: "4 ready" in region(browser, "overview"), "the replica turning ready")
    assert browser.execute_script("return window.notReloaded") is True
    assert console_errors(browser) == []


def test_node_commands_and_scale_from_the_page(gateway: ConsoleGateway, browser: Any) -> None:
    open_page(browser, gateway, "nodes")
    click(browser, f'button[data-key="cordon:{RACK[17]}"]')
    until(lambda: "cordon done" in by_css(browser, "#said").text, "the answer")
    assert ("node", RACK[17], ("cordon", "from the web console")) in gateway.cluster.commands
    # Drawn again from the cluster: the tray now offers to uncordon.
    until(lambda: by_css(browser, f'button[data-key="uncordon:{RACK[17]}"]'), "uncordon")

    click(browser, f'button[data-key="drain:{RACK[16]}"]')
    browser.switch_to.alert.dismiss()  # asked first; said no
    assert not any(c[1] == RACK[16] for c in gateway.cluster.commands)

    open_page(browser, gateway, "models")
    fill(browser, "#scale-qwen", "3\n")
    until(lambda: "3 replica(s) wanted" in by_css(browser, "#said").text, "the scale answer")
    assert ("scale", "qwen", 3) in gateway.cluster.commands
    # A count the model workflow's own request model refuses is refused before it is sent.
    fill(browser, "#scale-qwen", "10001\n", unbounded=True)
    until(lambda: "failed" in by_css(browser, "#said").text, "the refusal")
    assert "less than or equal to 10000" in by_css(browser, "#said").text
    assert ("scale", "qwen", 10001) not in gateway.cluster.commands
    assert console_errors(browser, allowed=("status of 400",)) == []


def test_keys_created_limited_and_revoked_from_the_page(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "keys")
    by_css(browser, "#key-name").send_keys("browser-made")
    by_css(browser, "#key-rpm").send_keys("30")
    by_css(browser, "#create-key button[type=submit]").click()
    secret = until(lambda: by_css(browser, "#new-key-value").text, "the new key")
    # The key the page showed opens the OpenAI API.
    with httpx.Client(base_url=gateway.url, trust_env=False) as http:
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {secret}"}).is_success
    row = until(
        lambda: next(
            r for r in all_css(browser, 'table[data-table="keys"] tr') if "browser-made" in r.text
        ),
        "the key's row",
    )
    assert "30 req/min" in row.text
    # The seeded key's use: every (day, model) row, and a bar per day and model in the chart.
    usage = [r.text for r in all_css(browser, 'table[data-table="usage"] tbody tr')]
    assert len(usage) == USAGE_DAYS * 2
    assert all(USAGE_KEY in r for r in usage)
    assert len(all_css(browser, "svg.chart rect")) == USAGE_DAYS * 2
    team = next(r for r in all_css(browser, "#keys-data tr") if r.text.startswith(USAGE_KEY))
    assert "2,000,000 tokens a day" in team.text
    # Requests 10 x (3 + 1) x (1 + 2 + 3 + 4 + 5); tokens (4,000 + 1,000) x (3 + 1) x 15.
    assert " 600 300,000" in team.text
    screenshot(browser, "keys", tmp_path)

    fill(browser, f"#limits-{row_key(gateway)}", "90\n")
    until(lambda: "limits of browser-made set" in by_css(browser, "#said").text, "limits set")
    made = made_key(gateway)
    assert made.limits.rpm == 90

    click(browser, f'button[data-key="revoke:{made.key_id}"]')
    browser.switch_to.alert.accept()
    until(lambda: "browser-made" not in region(browser, "keys"), "the key gone")
    assert console_errors(browser) == []


def made_key(gateway: ConsoleGateway) -> Any:
    (made,) = [k for k in gateway.call(gateway.store.list_keys()) if k.name == "browser-made"]
    return made


def row_key(gateway: ConsoleGateway) -> str:
    return str(made_key(gateway).key_id)


def test_a_model_added_from_the_page_is_checked_by_the_admin_api(
    gateway: ConsoleGateway, browser: Any
) -> None:
    open_page(browser, gateway, "models")
    spec = by_css(browser, "#model-spec")
    spec.send_keys('{"name": "Bad Name!"}')
    by_css(browser, "#add-model button[type=submit]").click()
    until(lambda: "failed" in by_css(browser, "#said").text, "the refusal")
    assert "Invalid model" in by_css(browser, "#said").text
    assert gateway.catalog.applied == []
    spec.clear()
    spec.send_keys(
        '{"name": "tiny", "weights": "/models/tiny.gguf", "replicas": 2,'
        ' "profiles": [{"engine": "llamacpp", "memory_mb": 2048}]}'
    )
    by_css(browser, "#add-model button[type=submit]").click()
    until(lambda: "model tiny defined" in by_css(browser, "#said").text, "the definition")
    assert [s.name for s in gateway.catalog.applied] == ["tiny"]
    assert console_errors(browser, allowed=("status of 400",)) == []


def test_routing_shows_decisions_by_reason(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "routing")

    # Two replica choices as the router counts them: one to the replica holding the prompt's
    # prefix, one by load.
    gateway.state.metrics.routed("deepseek", "prefix")
    gateway.state.metrics.routed("deepseek", "least_load")
    text = until(
        lambda: ("prefix" in region(browser, "routing") and region(browser, "routing")) or None,
        "the decisions",
    )
    assert "deepseek 2 1 50%" in text  # two choices, one to a replica holding the prefix
    screenshot(browser, "routing", tmp_path)
    assert console_errors(browser) == []
