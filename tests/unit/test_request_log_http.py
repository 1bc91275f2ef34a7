"""The request log and the charts' series over HTTP, against a real gateway and the llama-server
stand-in: a client's request found by its x-request-id with what the gateway knew of it, the
filters, prompts kept only for a key switched to log them, and nothing recorded with the log
off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.settings import GatewaySettings
from store import KeyLimits, Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    Gateway,
    fast_settings,
    recording_standin,
    route,
    running_gateway,
    sse_events,
)


@asynccontextmanager
async def served(
    store: Store, tmp_path: Path, settings: GatewaySettings | None = None
) -> AsyncIterator[Gateway]:
    """A gateway in front of one stand-in llama-server replica, smol-0."""
    async with recording_standin(tmp_path) as engine:
        source = FakeRouteSource(route("smol-0", engine.url))
        async with running_gateway(store, source, settings) as gw:
            yield gw


async def _logged(gw: Gateway, **filters: Any) -> list[dict[str, Any]]:
    response = await gw.client.get("/admin/v1/requests", params=filters)
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def _stream(gw: Gateway, content: str) -> httpx.Response:
    async with gw.client.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": True},
        headers=gw.auth,
    ) as response:
        await sse_events(response)
    return response


async def test_a_request_is_found_by_its_id_with_its_route_tokens_and_no_prompt(
    store: Store, tmp_path: Path
) -> None:
    async with served(store, tmp_path) as gw:
        response = await _stream(gw, "tell me about otters")
        request_id = response.headers["x-request-id"]
        (record,) = await _logged(gw, request_id=request_id)
        key = await store.get_key(gw.key_id)
        assert key is not None
        assert record["model"] == MODEL
        assert (record["key_id"], record["key_name"]) == (gw.key_id, key.name)
        assert (record["replica"], record["status"], record["stream"]) == ("smol-0", 200, True)
        assert record["reason"]
        assert record["routing_state"]
        assert record["ttft_s"] is not None
        assert 0 < record["ttft_s"] <= record["total_s"]
        assert record["prompt_tokens"] > 0
        assert record["completion_tokens"] > 0
        assert record["prompt"] is None, "no prompt is kept unless the key logs them"
        assert "otters" not in json.dumps(record)


async def test_filters_pick_by_model_status_class_key_and_ttft(
    store: Store, tmp_path: Path
) -> None:
    async with served(store, tmp_path) as gw:
        await _stream(gw, "one")
        missing = await gw.chat(model="no-such-model")
        assert missing.status_code == 404
        failed = await _logged(gw, status="4xx")
        assert [(r["model"], r["error_code"]) for r in failed] == [
            ("no-such-model", "model_not_found")
        ]
        assert failed[0]["request_id"] == missing.headers["x-request-id"]
        assert [r["status"] for r in await _logged(gw, model=MODEL)] == [200]
        assert len(await _logged(gw, key=gw.key_id)) == 2
        assert await _logged(gw, key="someone-else") == []
        assert await _logged(gw, replica="smol-9") == []
        assert await _logged(gw, min_ttft_ms=60_000) == []
        assert len(await _logged(gw, min_ttft_ms=0)) == 1, "only streams have a TTFT"
        bad = await gw.client.get("/admin/v1/requests", params={"status": "9xx"})
        assert bad.status_code == 400
        assert "status must be one of" in bad.text
        # The series: the model's one request counted in the bucket it ended in.
        series = await gw.client.get("/admin/v1/series", params={"model": MODEL})
        assert series.status_code == 200, series.text
        body = series.json()
        assert body["models"] == [MODEL], "an unknown model gets no series of its own"
        columns = body["series"]
        assert len(columns["t"]) == 360
        assert round(sum(columns["requests_per_s"]) * body["bucket_s"]) == 1
        assert [v for v in columns["ttft_p50_ms"] if v is not None]
        everything = (await gw.client.get("/admin/v1/series")).json()["series"]
        assert round(sum(everything["errors_per_s"]) * body["bucket_s"]) == 1
        unknown = await gw.client.get("/admin/v1/series", params={"key": "nobody"})
        assert unknown.status_code == 404


async def test_a_key_switched_to_log_prompts_has_them_kept(store: Store, tmp_path: Path) -> None:
    async with served(store, tmp_path) as gw:
        changed = await gw.client.put(
            f"/admin/v1/keys/{gw.key_id}/limits", json={"log_prompts": True}
        )
        assert changed.status_code == 200, changed.text
        assert changed.json()["limits"]["log_prompts"] is True
        for _ in range(50):  # the gateway rereads its keys every key_refresh_interval_s
            response = await gw.chat(messages=[{"role": "user", "content": "otters " * 5000}])
            (record,) = await _logged(gw, request_id=response.headers["x-request-id"])
            if record["prompt"] is not None:
                break
            await asyncio.sleep(0.05)
        assert record["prompt"] is not None
        assert "otters" in record["prompt"]
        assert len(record["prompt"]) == 4096, "a kept prompt is cut to its bound"
        stored = await store.get_key(gw.key_id)
        assert stored is not None
        assert stored.limits == KeyLimits(log_prompts=True)


async def test_with_the_log_off_nothing_is_recorded(store: Store, tmp_path: Path) -> None:
    async with served(store, tmp_path, fast_settings(request_log_size=0)) as gw:
        response = await gw.chat()
        assert response.status_code == 200
        assert "x-request-id" not in response.headers
        off = await gw.client.get("/admin/v1/requests")
        assert off.status_code == 404
        assert off.json()["error"]["code"] == "request_log_off"


async def test_the_fair_queue_is_sampled_into_the_series(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sampling task runs twice a bucket: with 0.2 s "buckets" for its interval only, the
    # first sample comes within a tenth of a second rather than 5 s.
    monkeypatch.setattr("gateway.app.BUCKET_S", 0.2)
    async with served(store, tmp_path) as gw:
        assert (await gw.chat()).status_code == 200
        for _ in range(100):
            columns = (await gw.client.get("/admin/v1/series", params={"model": MODEL})).json()
            if columns["series"]["queue_depth"][-1] is not None:
                break
            await asyncio.sleep(0.05)
        # Nothing waits in the queue: a sample of 0, told apart from no sample (null).
        assert columns["series"]["queue_depth"][-1] == 0
