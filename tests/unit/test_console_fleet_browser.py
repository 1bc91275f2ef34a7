"""The web console's mirror page, its import from Ollama, a node's own page, the replicas'
resources and the NVLink fabric per tray, in headless Chromium against the stand-in cluster
(tests/console_standin.py: a real mirror and Ollama store in the test's directory; the import
runs the real import code, its definition recorded by the stand-in). Each test fails on any
error in the browser's console."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser_kit import (
    NEEDS_BROWSER,
    all_css,
    by_css,
    click,
    console_errors,
    screenshot,
    until,
)
from tests.console_kit import ConsoleGateway, console_gateway, open_page, region
from tests.console_standin import (
    DEGRADED_TRAY,
    IMEX_DOWN_TRAY,
    MIG_NODE,
    MIRRORED,
    OLLAMA_MODEL,
    RACK,
    SMOL_OVER,
    UNJOINED_TRAY,
)

pytestmark = NEEDS_BROWSER
IMPORTED = "smollm2-135m"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    with console_gateway(tmp_path_factory.mktemp("console")) as gateway:
        yield gateway


def said(browser: Any) -> str:
    return str(by_css(browser, "#said").text)


def rows(browser: Any, table: str) -> list[str]:
    """The table's rows, each as one line of words."""
    found = all_css(browser, f'table[data-table="{table}"] tbody tr')
    return [" ".join(r.text.split()) for r in found]


def mirror_row(browser: Any, name: str) -> str:
    return next(r for r in rows(browser, "mirror") if r.startswith(f"{name} "))


def test_the_mirror_page_lists_each_artifact_its_models_and_nodes_beside_the_fetches(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "mirror")
    row = until(lambda: mirror_row(browser, MIRRORED), "deepseek's weights in the mirror")
    # Its size, its file, the model defined by it, the trays holding it, the one fetching it.
    assert "69.63 kB" in row
    assert "model-00001.safetensors" in row
    assert f" {MIRRORED} " in row
    assert ", ".join(RACK[0:4]) in row
    assert row.endswith(RACK[9])
    caption = by_css(browser, 'table[data-table="mirror"] caption').text
    assert caption == "The mirror: 1 name(s), 69.63 kB stored"
    fetches = by_css(browser, 'table[data-table="fetches"]').text
    assert "3.22 of 8.59 GB (37%)" in fetches
    screenshot(browser, "mirror", tmp_path)
    assert console_errors(browser) == []


def test_an_import_from_ollama_from_the_page_and_its_refusals(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "mirror")
    by_css(browser, "#import-reference").send_keys("nothere:1")
    by_css(browser, "#import-ollama button[type=submit]").click()
    until(lambda: "failed" in said(browser), "the refusal")
    assert "no model nothere:1 in the Ollama store" in said(browser)

    reference = by_css(browser, "#import-reference")
    reference.clear()
    reference.send_keys(OLLAMA_MODEL)
    by_css(browser, "#import-ollama button[type=submit]").click()
    until(lambda: f"as model {IMPORTED}" in said(browser), "the import started")
    row = until(
        lambda: next(r for r in rows(browser, "imports") if " done " in r), "the import done"
    )
    # Every byte copied, as the page counts them, and where it went.
    assert row.startswith(f"{OLLAMA_MODEL} {IMPORTED} done 524.29 kB of 524.29 kB (100%)")
    assert "models directory and mirror" in row
    (defined,) = [c[2] for c in gateway.cluster.commands if c[0] == "define"]
    assert defined.name == IMPORTED
    assert Path(defined.weights).is_file()
    # In the mirror under the model's name (the model itself is defined on its copy in the
    # models directory, as `import-ollama --mirror` defines it).
    mirrored = until(lambda: mirror_row(browser, IMPORTED), "its mirror name")
    assert "model.gguf ollama:smollm2:135m" in mirrored
    screenshot(browser, "mirror-import", tmp_path)

    # The same name again: refused, naming the clash.
    reference = by_css(browser, "#import-reference")
    reference.clear()
    reference.send_keys(OLLAMA_MODEL)
    by_css(browser, "#import-ollama button[type=submit]").click()
    until(lambda: "already defined" in said(browser), "the name clash")
    assert f"a model named '{IMPORTED}' is already defined" in said(browser)
    assert len([c for c in gateway.cluster.commands if c[0] == "define"]) == 1
    assert console_errors(browser, allowed=("status of 404", "status of 409")) == []


def tray_fabric(browser: Any, tray: str) -> str:
    return str(by_css(browser, f'[data-fabric="{tray}"]').text)


def test_the_nvlink_rack_shows_each_trays_fabric_and_imex(
    gateway: ConsoleGateway, browser: Any
) -> None:
    open_page(browser, gateway, "nvlink")
    until(lambda: all_css(browser, ".tray-fabric"), "the trays' fabric")
    assert tray_fabric(browser, RACK[0]) == "joined · IMEX up, 1 channel(s)"
    assert tray_fabric(browser, DEGRADED_TRAY) == "degraded (GPU 3) · IMEX up, 1 channel(s)"
    assert tray_fabric(browser, UNJOINED_TRAY) == "not joined (GPU 0) · IMEX up, 1 channel(s)"
    assert tray_fabric(browser, IMEX_DOWN_TRAY) == "joined · IMEX down"
    faulty = {
        e.get_attribute("data-fabric")
        for e in all_css(browser, ".tray-fabric.fabric-bad, .tray-fabric.fabric-degraded")
    }
    assert faulty == {DEGRADED_TRAY, UNJOINED_TRAY, IMEX_DOWN_TRAY}
    assert console_errors(browser) == []


def test_a_node_page_from_the_nodes_list_with_its_replicas_resources_and_commands(
    gateway: ConsoleGateway, browser: Any, tmp_path: Path
) -> None:
    open_page(browser, gateway, "nodes")
    click(browser, f'a[data-key="goto:{MIG_NODE}"]')
    page = until(lambda: by_css(browser, f'article[data-node-page="{MIG_NODE}"]'), "its page")
    assert by_css(browser, "#page-node").is_displayed()
    assert by_css(page, '[data-fact="driver"]').text.startswith("570.124.06 (CUDA 12.8)")
    assert by_css(page, '[data-fact="os"]').text == "Ubuntu 24.04.1 LTS, 6.8.0-47-generic, x86_64"
    assert "MIG 3g.40gb" in by_css(page, 'table[data-table="node-gpus"]').text
    assert "vllm 0.11.0 installed" in by_css(page, 'table[data-table="node-engines"]').text
    assert "smol-0 smol ready" in by_css(page, 'table[data-table="node-replicas"]').text
    over = by_css(page, '[data-over="smol-0"]').text
    assert over == f"Over its reservation: {SMOL_OVER}"
    assert "No NVLink fabric or IMEX" in by_css(page, '[data-part="fabric"]').text
    screenshot(browser, "node", tmp_path)

    # A tray's page: its fabric, and its GPUs' own.
    browser.get(f"{gateway.console}#node-{DEGRADED_TRAY}")
    tray = until(lambda: by_css(browser, f'article[data-node-page="{DEGRADED_TRAY}"]'), "tray")
    assert "degraded (GPU 3)" in by_css(tray, '[data-part="fabric"]').text
    gpus = [r.text for r in all_css(tray, 'table[data-table="node-gpus"] tbody tr')]
    assert "joined, degraded" in gpus[3]
    assert "degraded" not in gpus[0]
    resources = by_css(tray, 'table[data-table="node-resources"]').text
    assert "deepseek-1" in resources
    assert "within" in resources

    # The node's commands from its page.
    click(browser, f'#node-data button[data-key="cordon:{DEGRADED_TRAY}"]')
    until(lambda: "cordon done" in said(browser), "the answer")
    assert ("node", DEGRADED_TRAY, ("cordon", "from the web console")) in gateway.cluster.commands
    until(lambda: by_css(browser, f'#node-data button[data-key="uncordon:{DEGRADED_TRAY}"]'), "")
    assert console_errors(browser) == []


def test_a_model_using_more_than_it_reserved_is_warned_of(
    gateway: ConsoleGateway, browser: Any
) -> None:
    open_page(browser, gateway, "models")
    warning = until(lambda: by_css(browser, '[data-over-model="smol"]').text, "the warning")
    assert f"smol-0 on {MIG_NODE}: {SMOL_OVER}" in warning
    assert not all_css(browser, '[data-over-model="deepseek"]')
    deepseek = by_css(browser, 'table[data-table="resources-deepseek"]').text
    assert "30,720 / 65,536 MiB" in deepseek  # each shard's memory, used of reserved
    assert "deepseek" in region(browser, "models")
    assert console_errors(browser) == []
