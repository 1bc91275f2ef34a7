"""Who the admin API answers: the rules of gateway/admin/guard.py on their own, then through a
real gateway socket as a browser page or a local tool would send them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from starlette.requests import Request

from gateway.admin.guard import (
    check_admin_request,
    check_same_site,
    host_is_local_name,
    is_loopback_client,
    origin_matches_host,
)
from gateway.admin.models import require_same_site_json
from gateway.admin.routes import require_local
from gateway.errors import ApiError
from store import Store, open_store
from tests.gateway_kit import CatalogSource, assert_openai_error, running_gateway
from workflows.contracts import ModelSpec, Profile

GOOD = ModelSpec(name="smol", weights="/w/smol.gguf", profiles=[Profile(memory_mb=512)])
HOST = "127.0.0.1:8000"


def refusal(method: str, client: str | None, headers: dict[str, str]) -> tuple[int, str] | None:
    try:
        check_admin_request(method, client, {k.lower(): v for k, v in headers.items()})
    except ApiError as err:
        return err.status, str(err.code)
    return None


# --- the rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),  # all of 127/8 is this machine
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # a dual-stack listener's view of 127.0.0.1
        ("10.0.0.7", False),
        ("::ffff:10.0.0.7", False),
        ("2001:db8::1", False),
        ("0.0.0.0", False),
        ("", False),
        (None, False),
        ("localhost", False),  # a peer is an address, never a name
    ],
)
def test_only_this_machine_is_a_loopback_client(client: str | None, loopback: bool) -> None:
    assert is_loopback_client(client) is loopback


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.0.1:8000", "localhost", "LOCALHOST:80", "[::1]:8000", "[::1]", "10.1.2.3"],
)
def test_host_naming_an_address_or_localhost_is_accepted(host: str) -> None:
    assert host_is_local_name(host)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example.com",
        "evil.example.com:8000",
        "127.0.0.1.nip.io",  # resolves to 127.0.0.1, but a name someone else's DNS decides
        "localhost.evil.example",
        "localhost.",
        "user@127.0.0.1",
        "127.0.0.1:8000:1",
        "127.0.0.1:0",
        "127.0.0.1:99999",
        "127.0.0.1:\uff18\uff10",  # full-width digits
        "[::1",
        "[::1]x",
        "0x7f000001",
        "2130706433",
        "",
    ],
)
def test_host_a_page_could_choose_is_refused(host: str) -> None:
    assert not host_is_local_name(host)


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://localhost:8000", "localhost:8000", True),
        ("http://LOCALHOST:8000", "localhost:8000", True),
        ("http://[::1]:8000", "[::1]:8000", True),
        ("http://127.0.0.1", "127.0.0.1:80", True),  # the scheme's port counts as given
        ("https://127.0.0.1", "127.0.0.1:443", True),
        ("http://127.0.0.1:3000", "127.0.0.1:8000", False),  # another local app's page
        ("http://localhost:8000", "127.0.0.1:8000", False),  # another origin, same socket
        ("http://evil.example:8000", "evil.example:8000", False),  # a rebound name
        ("null", "127.0.0.1:8000", False),  # sandboxed frames, file: pages
        ("file://", "127.0.0.1:8000", False),
        ("ftp://127.0.0.1:8000", "127.0.0.1:8000", False),
        ("http://127.0.0.1:8000/path", "127.0.0.1:8000", False),
        ("http://user@127.0.0.1:8000", "127.0.0.1:8000", False),
        ("", "127.0.0.1:8000", False),
    ],
)
def test_an_origin_is_accepted_only_when_it_is_this_origin(
    origin: str, host: str, same: bool
) -> None:
    assert origin_matches_host(origin, host) is same


@pytest.mark.parametrize("site", ["cross-site", "same-site", "CROSS-SITE", "garbage", ""])
def test_a_request_a_browser_marks_cross_site_is_refused(site: str) -> None:
    assert refusal("GET", "127.0.0.1", {"Host": HOST, "Sec-Fetch-Site": site}) == (
        403,
        "admin_cross_site",
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, the llmgw CLI: no browser headers at all
        {"Sec-Fetch-Site": "none"},  # the operator typed the URL
        {"Sec-Fetch-Site": "same-origin", "Origin": f"http://{HOST}"},
    ],
)
def test_local_tools_and_the_operators_own_browser_are_served(headers: dict[str, str]) -> None:
    assert refusal("GET", "127.0.0.1", {"Host": HOST, **headers}) is None


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "post"])
@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "json"],
)
def test_a_change_not_declared_json_is_refused_for_every_write_method(
    method: str, content_type: str | None
) -> None:
    headers = {"Host": HOST} | ({"Content-Type": content_type} if content_type else {})
    assert refusal(method, "127.0.0.1", headers) == (415, "unsupported_media_type")


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_a_change_declared_json_is_accepted(content_type: str) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        headers = {"Host": HOST, "Content-Type": content_type}
        assert refusal(method, "127.0.0.1", headers) is None


def test_reads_need_no_content_type() -> None:
    assert refusal("GET", "127.0.0.1", {"Host": HOST}) is None
    assert refusal("HEAD", "127.0.0.1", {"Host": HOST}) is None


def test_the_refusal_names_who_is_asking_before_what_is_sent() -> None:
    # Off the machine and cross-site and text/plain: the first reason is the one given.
    headers = {"Host": HOST, "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
    assert refusal("POST", "10.0.0.7", headers) == (403, "admin_local_only")
    assert refusal("POST", "127.0.0.1", headers) == (403, "admin_cross_site")
    assert refusal("POST", "127.0.0.1", {**headers, "Sec-Fetch-Site": "same-origin"}) == (
        415,
        "unsupported_media_type",
    )


def test_same_site_checks_read_lowercase_names_as_starlette_gives_them() -> None:
    with pytest.raises(ApiError):
        check_same_site({"host": HOST, "origin": "null"})


# --- the two FastAPI dependencies other routers use ----------------------------------------


def request(method: str, client: str, headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": method, "path": "/admin/v1/x", "headers": raw}
    return Request({**scope, "client": (client, 40000)})


def test_require_local_applies_every_rule() -> None:
    require_local(request("GET", "127.0.0.1", {"Host": HOST}))
    require_local(
        request("DELETE", "::1", {"Host": "[::1]:8000", "Content-Type": "application/json"})
    )
    for method, client, headers, status in [
        ("GET", "10.0.0.7", {"Host": HOST}, 403),
        ("GET", "127.0.0.1", {"Host": "evil.example"}, 403),
        ("GET", "127.0.0.1", {"Host": HOST, "Origin": "http://evil.example"}, 403),
        ("DELETE", "127.0.0.1", {"Host": HOST}, 415),  # bodiless, still declared JSON
    ]:
        with pytest.raises(ApiError) as caught:
            require_local(request(method, client, headers))
        assert caught.value.status == status


def test_require_same_site_json_wants_json_whatever_the_method() -> None:
    require_same_site_json(
        request("PUT", "127.0.0.1", {"Host": HOST, "Content-Type": "application/json"})
    )
    with pytest.raises(ApiError) as caught:
        require_same_site_json(request("GET", "127.0.0.1", {"Host": HOST}))
    assert caught.value.status == 415
    with pytest.raises(ApiError) as caught:
        require_same_site_json(
            request(
                "PUT",
                "127.0.0.1",
                {"Host": HOST, "Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"},
            )
        )
    assert caught.value.status == 403


# --- through a real server -----------------------------------------------------------------


@pytest.fixture(scope="module")
async def store(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Store]:
    store = open_store(None, tmp_path_factory.mktemp("admin-guard"))
    await store.init()
    yield store
    await store.close()


async def test_a_simple_cross_site_post_cannot_define_a_model(store: Store) -> None:
    """The seed's attack: a page POSTs text/plain (no preflight) to the operator's tunnel."""
    source = CatalogSource()
    async with running_gateway(store, source) as gw:
        body = GOOD.model_dump_json()
        for headers, status, code in [
            ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
            ({"Content-Type": "text/plain;charset=UTF-8", "Origin": "null"}, 403, None),
            (
                {
                    "Content-Type": "application/json",
                    "Origin": "http://127.0.0.1:3000",
                    "Sec-Fetch-Site": "same-site",
                },
                403,
                "admin_cross_site",
            ),
            ({"Content-Type": "application/json", "Host": "attacker.example"}, 403, None),
        ]:
            reply = await gw.client.put("/admin/v1/models/smol", content=body, headers=headers)
            assert_openai_error(reply, status, code)
        assert source.applied == []
        # The operator's own tools still can.
        reply = await gw.client.put(
            "/admin/v1/models/smol", content=body, headers={"Content-Type": "application/json"}
        )
        assert reply.status_code == 200, reply.text
        assert source.applied == [GOOD]


async def test_a_cross_site_page_cannot_read_the_admin_api(store: Store) -> None:
    async with running_gateway(store, CatalogSource()) as gw:
        for path in ("/admin/v1/routes", "/admin/v1/models"):
            reply = await gw.client.get(path, headers={"Sec-Fetch-Site": "cross-site"})
            assert_openai_error(reply, 403, "admin_cross_site")
            reply = await gw.client.get(path, headers={"Origin": "http://evil.example"})
            assert_openai_error(reply, 403, "admin_cross_site")
            same_origin = {"Origin": gw.url, "Sec-Fetch-Site": "same-origin"}
            assert (await gw.client.get(path, headers=same_origin)).status_code == 200
