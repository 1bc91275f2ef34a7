"""Headless Chromium for the web console's tests, driven through chromedriver with selenium:
Debian's `chromium` and `chromium-driver` (the Makefile's `browser` step installs them), run
with --no-sandbox because the tests may run as root.

Every page's console messages are collected; `console_errors` is what a test fails on.
Screenshots go into the test's own directory, or into docs/console/ when
LLMGW_CONSOLE_SCREENSHOTS=1 (how the ones docs/console.md shows were taken).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DOCS_SHOTS = Path(__file__).resolve().parents[1] / "docs" / "console"
WIDTH = 1360
T = TypeVar("T")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing: `make browser` installs chromium and chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


# Every browser test module's mark: skipped, saying why, where Chromium cannot run.
NEEDS_BROWSER = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))


@contextmanager
def chromium(width: int = WIDTH, height: int = 900) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        # Nothing but the console: no sync, no component updates reaching for the network.
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any, allowed: tuple[str, ...] = ()) -> list[str]:
    """The browser console's errors since the last call (CSP refusals, script errors, failed
    loads), less those naming one of `allowed` (a refusal the test provoked on purpose)."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" and not any(a in entry["message"] for a in allowed)
    ]


def until(check: Callable[[], T | None], what: str, within_s: float = 20.0) -> T:
    """Poll `check` until it returns something truthy (the page updates itself)."""
    deadline = time.monotonic() + within_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - an element not drawn yet; try again
            last = err
        time.sleep(0.1)
    raise AssertionError(f"the console did not show {what} within {within_s:.0f} s ({last})")


def screenshot(driver: Any, name: str, tmp: Path, max_height: int = 2000) -> Path:
    """The page as PNG, down to `max_height` pixels: the viewport set to the page's height
    first (a screenshot holds the viewport only; the window's size counts the browser's own
    frame too, so the viewport is set through DevTools)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    metrics = {"width": WIDTH, "height": min(height, max_height), "deviceScaleFactor": 1}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "mobile": False})
    target_dir = DOCS_SHOTS if os.environ.get("LLMGW_CONSOLE_SCREENSHOTS") == "1" else tmp
    target_dir.mkdir(parents=True, exist_ok=True)
    path = target_dir / f"{name}.png"
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return path


def by_css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def fill(driver: Any, selector: str, text: str, unbounded: bool = False) -> None:
    """Type into a field the live updates may be drawing again: found and focused in one try
    (the page leaves a focused field alone), then typed into."""

    def focus() -> bool:
        field = by_css(driver, selector)
        if unbounded:  # past the browser's own check, to reach the server's
            driver.execute_script("arguments[0].removeAttribute('max')", field)
        field.click()
        return True

    from selenium.webdriver.common.keys import Keys

    until(focus, selector)
    # Not clear(): WebDriver's clear leaves the field, and the page would draw it again.
    driver.switch_to.active_element.send_keys(Keys.CONTROL, "a")
    driver.switch_to.active_element.send_keys(Keys.BACKSPACE, text)


def click(driver: Any, selector: str) -> None:
    until(lambda: by_css(driver, selector).click() or True, selector)
