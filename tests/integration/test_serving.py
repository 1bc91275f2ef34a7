"""A model defined through the CLI is placed, started, routed and metered; bad requests get
OpenAI-shaped errors."""

import re
from pathlib import Path

import httpx
import openai
import pytest

from tests.system import System, wait_for, wait_ready

pytestmark = pytest.mark.integration


async def test_model_defined_by_cli_serves_plain_and_streamed_chat_with_usage(
    system: System, weights: Path
) -> None:
    system.cli("model", "add", "echo", "--weights", str(weights), "--cpu-cores", "1")
    await wait_ready(system, "echo", 1)
    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key)

    reply = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hello there"}]
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0

    chunks = list(
        client.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "stream please"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None

    models = [m.id for m in client.models.list()]
    assert "echo" in models

    def usage_recorded() -> bool:
        out = system.cli("usage", "--model", "echo").stdout
        return any(line.split()[3:4] == ["2"] for line in out.splitlines()[1:])

    wait_for(usage_recorded, 15, "two requests in llmgw usage")


@pytest.mark.usefixtures("weights")
async def test_bad_requests_get_openai_shaped_errors(system: System) -> None:
    await wait_ready(system, "echo", 1)
    url = f"{system.base_url}/chat/completions"
    good = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    auth = {"Authorization": f"Bearer {system.api_key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        no_key = await http.post(url, json=good)
        assert no_key.status_code == 401
        assert no_key.json()["error"]["code"] == "invalid_api_key"
        wrong = await http.post(url, json=good, headers={"Authorization": "Bearer llmgw-00-x"})
        assert wrong.status_code == 401

        unknown = await http.post(url, json={**good, "model": "nope"}, headers=auth)
        assert unknown.status_code == 404
        assert "error" in unknown.json()

        broken = await http.post(
            url, content=b"{not json", headers={**auth, "Content-Type": "application/json"}
        )
        assert broken.status_code == 400
        assert "Traceback" not in broken.text

        redirect = await http.post(url, json={**good, "api_base": "http://evil"}, headers=auth)
        assert redirect.status_code == 400


async def test_a_loading_replica_is_not_routed_and_the_client_is_told_to_retry(
    system: System, weights: Path
) -> None:
    system.cli(
        "model", "add", "slow", "--weights", str(weights), "--cpu-cores", "1",
        "--arg=--load-delay", "--arg=600",
    )  # fmt: skip

    async def loading() -> bool:
        state = await system.ledger()
        return any(r.model == "slow" and r.state.value == "loading" for r in state.routes.values())

    await system.until(loading, 60, "slow to be loading")
    async with httpx.AsyncClient(timeout=30) as http:
        headers = {"Authorization": f"Bearer {system.api_key}"}

        async def gateway_knows_it() -> bool:
            listed = (await http.get(f"{system.base_url}/models", headers=headers)).json()
            return any(m["id"] == "slow" for m in listed["data"])

        # The gateway's table follows the ledger within about a second.
        await system.until(gateway_knows_it, 10, "the gateway to list slow")
        resp = await http.post(
            f"{system.base_url}/chat/completions",
            json={"model": "slow", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {system.api_key}"},
        )
    assert resp.status_code == 503
    assert resp.headers["Retry-After"]

    # What placement reserved beside what the (loading) engine's processes hold, as measured
    # by the node's agent: `llmgw model resources`.
    async def measured() -> bool:
        listing = system.cli("model", "resources", "slow").stdout
        return re.search(rf"slow-0 +{system.node} +1 +\d+ MiB / \d+ MiB", listing) is not None

    await system.until(measured, 30, "the agent to measure slow-0's memory")
    system.cli("model", "rm", "slow")
    await system.until(lambda: system.released("slow"), 60, "slow to release its allocation")
    assert system.engine_processes("--load-delay") == []
