"""The console's playground endpoint over HTTP, against a real gateway and the llama-server
stand-in: refused cross-site like every console change, and otherwise the OpenAI route's own
path with the operator's key, so a missing or wrong key is the API's 401, a key's allowlist and
budget still apply, and a good key's stream is logged and billed as any client's request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from store import KeyLimits, Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    Gateway,
    assert_openai_error,
    recording_standin,
    route,
    running_gateway,
    sse_events,
)

CHAT = "/admin/v1/playground/chat/completions"


@asynccontextmanager
async def served(store: Store, tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway in front of one stand-in llama-server replica, smol-0, loading an adapter."""
    async with recording_standin(tmp_path) as engine:
        replica = route("smol-0", engine.url).model_copy(update={"adapters": ["pirate"]})
        async with running_gateway(store, FakeRouteSource(replica)) as gw:
            yield gw


def _body(**overrides: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me about otters"}],
        "stream": True,
        **overrides,
    }


async def _logged(gw: Gateway, request_id: str) -> dict[str, Any]:
    answer = await gw.client.get("/admin/v1/requests", params={"request_id": request_id})
    assert answer.status_code == 200, answer.text
    (record,) = answer.json()["data"]
    assert isinstance(record, dict)
    return record


async def _accepted(gw: Gateway, api_key: str) -> None:
    """A key made in the store works once the gateway's key refresh has read it."""
    for _ in range(100):
        answer = await gw.client.post(
            CHAT, json=_body(stream=False), headers={"Authorization": f"Bearer {api_key}"}
        )
        if answer.status_code != 401:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the new key was never accepted")


async def test_a_good_key_streams_and_is_logged_and_billed_as_any_request(
    store: Store, tmp_path: Path
) -> None:
    async with served(store, tmp_path) as gw:
        async with gw.client.stream("POST", CHAT, json=_body(), headers=gw.auth) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = await sse_events(response)
        assert events[-1] == "[DONE]"
        text = "".join(
            (json.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
            for e in events[:-1]
        )
        assert text
        record = await _logged(gw, response.headers["x-request-id"])
        # Recorded under the OpenAI route's path, routed and timed like a client's stream.
        assert record["path"] == "/v1/chat/completions"
        assert (record["key_id"], record["model"], record["replica"]) == (
            gw.key_id,
            MODEL,
            "smol-0",
        )
        assert (record["status"], record["stream"]) == (200, True)
        assert record["reason"]
        assert record["ttft_s"] is not None
        assert record["completion_tokens"] > 0
        # The usage is the key's, in the store, as for any request.
        prompt, completion = await gw.usage_totals(1)
        assert (prompt, completion) == (record["prompt_tokens"], record["completion_tokens"])


async def test_no_key_or_a_wrong_one_is_the_apis_401(store: Store, tmp_path: Path) -> None:
    async with served(store, tmp_path) as gw:
        missing = await gw.client.post(CHAT, json=_body())
        assert_openai_error(missing, 401, "invalid_api_key")
        wrong = await gw.client.post(
            CHAT, json=_body(), headers={"Authorization": "Bearer sk-llmgw-not-a-key"}
        )
        assert_openai_error(wrong, 401, "invalid_api_key")
        record = await _logged(gw, wrong.headers["x-request-id"])
        assert (record["path"], record["status"]) == ("/v1/chat/completions", 401)
        unknown = await gw.client.post(CHAT, json=_body(model="no-such-model"), headers=gw.auth)
        assert_openai_error(unknown, 404, "model_not_found")
        assert await store.usage(key_id=gw.key_id) == []


async def test_a_keys_allowlist_and_budget_apply(store: Store, tmp_path: Path) -> None:
    async with served(store, tmp_path) as gw:
        _, other_model_only = await store.create_key("other-model", models=["qwen"])
        await _accepted(gw, gw.api_key)
        for _ in range(100):
            refused = await gw.client.post(
                CHAT, json=_body(), headers={"Authorization": f"Bearer {other_model_only}"}
            )
            if refused.status_code != 401:
                break
            await asyncio.sleep(0.05)
        assert_openai_error(refused, 403, "model_not_allowed")
        _, tiny = await store.create_key("tiny", limits=KeyLimits(token_budget=1))
        await _accepted(gw, tiny)
        over = await gw.client.post(CHAT, json=_body(), headers={"Authorization": f"Bearer {tiny}"})
        assert over.status_code == 429, over.text


async def test_refused_cross_site_or_not_as_json(store: Store, tmp_path: Path) -> None:
    async with served(store, tmp_path) as gw:
        cross = await gw.client.post(
            CHAT, json=_body(), headers={**gw.auth, "Sec-Fetch-Site": "cross-site"}
        )
        assert_openai_error(cross, 403, "admin_cross_site")
        elsewhere = await gw.client.post(
            CHAT, json=_body(), headers={**gw.auth, "Origin": "http://127.0.0.1:1"}
        )
        assert_openai_error(elsewhere, 403, "admin_cross_site")
        form = await gw.client.post(
            CHAT,
            content=json.dumps(_body()),
            headers={**gw.auth, "Content-Type": "text/plain"},
        )
        assert form.status_code == 415
        assert await store.usage(key_id=gw.key_id) == []


async def test_the_models_on_offer_with_their_adapters(store: Store, tmp_path: Path) -> None:
    async with served(store, tmp_path) as gw:
        answer = await gw.client.get("/admin/v1/playground/models")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "data": [{"model": MODEL, "ready_replicas": 1, "adapters": ["pirate"]}]
        }
        through = await gw.client.post(
            CHAT, json=_body(model=f"{MODEL}:pirate", stream=False), headers=gw.auth
        )
        assert through.status_code == 200, through.text
        record = await _logged(gw, through.headers["x-request-id"])
        assert (record["model"], record["adapter"]) == (MODEL, "pirate")
