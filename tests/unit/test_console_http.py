"""The web console's hardening and its commands' validation, over HTTP without a browser: the
real app and store, the stand-in cluster (tests/console_standin.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.console.routes import ASSETS, CONTENT_SECURITY_POLICY
from gateway.console.source import ClusterCache
from gateway.front_door import allowed_on
from store import Store
from tests.console_kit import ConsoleGateway, console_gateway
from tests.console_standin import RACK
from tests.gateway_kit import FakeRouteSource, running_gateway

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    with console_gateway(tmp_path_factory.mktemp("console")) as gateway:
        yield gateway


@pytest.fixture
def http(gateway: ConsoleGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, trust_env=False) as client:
        yield client


def test_the_page_and_every_asset_carry_the_strict_policy(http: httpx.Client) -> None:
    for path in ["/admin/console/", *(f"/admin/console/{name}" for name in ASSETS)]:
        response = http.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-store"
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    page = http.get("/admin/console/").text
    # Every script is a file of its own; no inline script or style for the policy to refuse.
    assert "<script>" not in page
    assert "style=" not in page
    assert "<style" not in page


def test_only_the_console_files_are_served(http: httpx.Client) -> None:
    assert http.get("/admin/console/routes.py").status_code == 404
    assert http.get("/admin/console/..%2Froutes.py").status_code == 404
    assert http.get("/admin/console/static").status_code == 404


def test_the_console_is_on_the_admin_listener_only() -> None:
    assert allowed_on("/admin/console/", on_admin=True)
    assert not allowed_on("/admin/console/", on_admin=False)
    assert not allowed_on("/admin/console/console.js", on_admin=False)


def test_a_cross_site_page_can_neither_read_nor_command(
    http: httpx.Client, gateway: ConsoleGateway
) -> None:
    before = list(gateway.cluster.commands)
    cross = {"Sec-Fetch-Site": "cross-site"}
    assert http.get("/admin/console/", headers=cross).status_code == 403
    assert http.get("/admin/v1/console", headers=cross).status_code == 403
    evil = {**JSON, "Origin": "http://evil.example"}
    assert http.post(f"/admin/v1/nodes/{RACK[0]}/drain", json={}, headers=evil).status_code == 403
    # A form or text/plain (what a page may send anywhere without asking) is refused.
    plain = {"Content-Type": "text/plain"}
    assert (
        http.post(f"/admin/v1/nodes/{RACK[0]}/drain", content="{}", headers=plain).status_code
        == 415
    )
    # A page on another localhost port is another origin.
    other_port = {**JSON, "Origin": "http://127.0.0.1:1"}
    response = http.post("/admin/v1/models/qwen/scale", json={"replicas": 0}, headers=other_port)
    assert response.status_code == 403
    imported = http.post(
        "/admin/v1/imports/ollama", json={"reference": "smollm2:135m"}, headers=evil
    )
    assert imported.status_code == 403
    assert gateway.cluster.commands == before
    assert gateway.cluster.imports is not None
    assert gateway.cluster.imports.views() == []


def test_commands_are_checked_before_they_reach_the_cluster(
    http: httpx.Client, gateway: ConsoleGateway
) -> None:
    before = list(gateway.cluster.commands)
    assert http.post(f"/admin/v1/nodes/{RACK[0]}/rm", json={}).status_code == 404
    extra = http.post(f"/admin/v1/nodes/{RACK[0]}/cordon", json={"reason": "x", "force": True})
    assert extra.status_code == 400
    assert "force" in extra.json()["error"]["message"]
    negative = http.post("/admin/v1/models/qwen/scale", json={"replicas": -1})
    assert negative.status_code == 400
    assert "replicas" in negative.json()["error"]["message"]
    for body in ({"reference": ""}, {"reference": "smollm2:135m", "store": "/etc"}):
        refused = http.post("/admin/v1/imports/ollama", json=body)
        assert refused.status_code == 400, body
    assert gateway.cluster.commands == before
    assert gateway.cluster.imports is not None
    assert gateway.cluster.imports.views() == []
    # What the cluster itself refuses comes back in its words.
    missing = http.post("/admin/v1/nodes/no-such-node/cordon", json={})
    assert missing.status_code == 404
    assert "no node 'no-such-node'" in missing.json()["error"]["message"]


async def test_a_gateway_without_a_cluster_view_still_shows_its_own_figures(
    store: Store,
) -> None:
    async with running_gateway(store, FakeRouteSource()) as gw:
        data = (await gw.client.get("/admin/v1/console")).json()
        assert data["cluster"] is None
        assert [k["name"] for k in data["gateway"]["keys"]] == [
            k.name for k in await store.list_keys()
        ]
        assert data["gateway"]["peers"] == {}  # the peer bus is on, and no other gateway runs
        response = await gw.client.post("/admin/v1/nodes/n/cordon", json={})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "no_cluster"


class FlakyCluster:
    """Reads once, then fails as an unreachable Temporal would."""

    def __init__(self) -> None:
        self.reads = 0

    async def read(self) -> dict[str, Any]:
        self.reads += 1
        if self.reads > 1:
            raise ConnectionError("Temporal at 127.0.0.1:7233 is not answering")
        return {"nodes": [{"name": "n1"}], "problems": []}

    async def node_command(self, node: str, action: str, reason: str) -> str:
        raise AssertionError("not asked")

    async def scale(self, model: str, replicas: int) -> str:
        raise AssertionError("not asked")

    async def import_ollama(self, reference: str, name: str, mirror: bool) -> str:
        raise AssertionError("not asked")


async def test_a_failed_read_keeps_the_last_cluster_and_says_why() -> None:
    cache = ClusterCache(FlakyCluster())
    assert (await cache.read())["nodes"] == [{"name": "n1"}]
    cache.forget()  # as after a command: the next poll reads again
    data = await cache.read()
    assert data["nodes"] == [{"name": "n1"}]
    assert data["problems"] == [
        "the cluster could not be read: Temporal at 127.0.0.1:7233 is not answering"
    ]
