"""The remote console in headless Chromium: logging in through the form with an admin key, a
change from the page (which must carry the session's CSRF token to pass), and logging out. The
real app and store, the stand-in cluster; fails on any error in the browser's console."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser_kit import (
    NEEDS_BROWSER,
    by_css,
    chromium,
    console_errors,
    screenshot,
    until,
)
from tests.console_kit import ConsoleGateway, console_gateway
from tests.gateway_kit import fast_settings

pytestmark = NEEDS_BROWSER


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    settings = fast_settings(console_remote=True)
    with console_gateway(tmp_path_factory.mktemp("remote"), settings) as gateway:
        yield gateway


def submit_key(driver: Any, key: str) -> None:
    field = until(lambda: by_css(driver, "#key"), "the login form")
    field.clear()
    field.send_keys(key)
    by_css(driver, "form button[type=submit]").click()


def test_log_in_through_the_form_work_and_log_out(gateway: ConsoleGateway, tmp_path: Path) -> None:
    _, admin_key = gateway.call(gateway.store.create_key("ops", admin=True))
    _, client_key = gateway.call(gateway.store.create_key("app"))
    with chromium() as browser:
        browser.get(f"{gateway.url}/console/")
        until(lambda: browser.current_url.endswith("/console/login"), "the login page")
        assert not by_css(browser, "#refused").is_displayed()

        submit_key(browser, client_key)  # a working key, but not an admin's
        until(lambda: by_css(browser, "#refused").is_displayed(), "the refusal")
        screenshot(browser, "remote-login-refused", tmp_path)

        # The gateway reads new keys within its key refresh; the form is simply tried again.
        def logged_in() -> bool:
            if browser.current_url.endswith("/console/login"):
                submit_key(browser, admin_key)
            return "Updated" in by_css(browser, "#freshness").text

        until(logged_in, "the console after logging in")
        assert browser.current_url == f"{gateway.url}/console/"
        assert by_css(browser, "#logout").is_displayed()

        browser.get(f"{gateway.url}/console/#keys")
        until(lambda: "Updated" in by_css(browser, "#freshness").text, "the keys page")
        by_css(browser, "#key-name").send_keys("made-remotely")
        by_css(browser, "#key-admin").click()
        by_css(browser, "#create-key button[type=submit]").click()
        assert until(lambda: by_css(browser, "#new-key-value").text, "the new key")
        roles = {key.name: key.admin for key in gateway.call(gateway.store.list_keys())}
        assert roles["made-remotely"] is True
        row = until(
            lambda: next(
                r
                for r in browser.find_elements("css selector", 'table[data-table="keys"] tr')
                if r.text.startswith("made-remotely")
            ),
            "the new key's row",
        )
        assert row.text.startswith("made-remotely admin")
        screenshot(browser, "remote-keys", tmp_path)

        by_css(browser, "#logout button").click()
        until(lambda: browser.current_url.endswith("/console/login"), "the login page again")
        browser.get(f"{gateway.url}/console/")
        until(lambda: browser.current_url.endswith("/console/login"), "no way back in")
        # The refused logins' 401 answers are the only errors the browser may report.
        assert console_errors(browser, allowed=("401",)) == []
