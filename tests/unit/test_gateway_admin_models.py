"""Defining models through the admin API: checked like the CLI, and never from a browser page."""

from collections.abc import AsyncIterator

import pytest

from store import Store, open_store
from tests.gateway_kit import FakeRouteSource, assert_openai_error, running_gateway
from workflows.contracts import ModelSpec, ModelView, Profile

JSON = "application/json"
GOOD = ModelSpec(name="smol", weights="/w/smol.gguf", profiles=[Profile(memory_mb=512)])


class CatalogSource(FakeRouteSource):
    def __init__(self) -> None:
        super().__init__()
        self.applied: list[ModelSpec] = []

    async def apply_model(self, spec: ModelSpec) -> ModelView:
        self.applied.append(spec)
        return ModelView(spec=spec)

    async def list_models(self) -> list[ModelView]:
        return [ModelView(spec=s) for s in self.applied]


@pytest.fixture(scope="module")
async def store(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Store]:
    store = open_store(None, tmp_path_factory.mktemp("admin-models"))
    await store.init()
    yield store
    await store.close()


async def test_a_model_put_as_json_is_defined_and_listed(store: Store) -> None:
    source = CatalogSource()
    async with running_gateway(store, source) as gw:
        put = await gw.client.put("/admin/v1/models/smol", content=GOOD.model_dump_json(),
                                  headers={"Content-Type": "application/json"})  # fmt: skip
        listed = (await gw.client.get("/admin/v1/models")).json()
    assert put.status_code == 200, put.text
    assert source.applied == [GOOD]
    assert [m["spec"]["name"] for m in listed["data"]] == ["smol"]


async def test_an_invalid_definition_is_refused_naming_the_field(store: Store) -> None:
    source = CatalogSource()
    bad = GOOD.model_copy(update={"profiles": [Profile(engine="sglang", memory_mb=512)]})
    async with running_gateway(store, source) as gw:
        reply = await gw.client.put("/admin/v1/models/smol", content=bad.model_dump_json(),
                                    headers={"Content-Type": "application/json"})  # fmt: skip
        renamed = await gw.client.put("/admin/v1/models/other", content=GOOD.model_dump_json(),
                                      headers={"Content-Type": "application/json"})  # fmt: skip
    assert_openai_error(reply, 400, "invalid_model")
    assert "profiles[0].gpu_class" in reply.json()["error"]["message"]
    assert_openai_error(renamed, 400, "invalid_model")
    assert source.applied == []


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        (
            {"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"},
            403,
            "admin_cross_site",
        ),
        (
            {"Content-Type": "application/json", "Origin": "http://evil.example"},
            403,
            "admin_cross_site",
        ),
    ],
)
async def test_a_change_a_browser_page_could_send_is_refused(
    store: Store, headers: dict[str, str], status: int, code: str
) -> None:
    source = CatalogSource()
    async with running_gateway(store, source) as gw:
        reply = await gw.client.put("/admin/v1/models/smol", content=GOOD.model_dump_json(),
                                    headers=headers)  # fmt: skip
    assert_openai_error(reply, status, code)
    assert source.applied == []
