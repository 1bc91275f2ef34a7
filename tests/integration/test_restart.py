"""Ctrl-C stops everything, engines included; `llmgw up` again finds the same models, keys and
usage, and serves again."""

from pathlib import Path

import httpx
import openai
import pytest

from tests.system import System, wait_for, wait_ready

pytestmark = pytest.mark.integration


async def test_ctrl_c_leaves_nothing_and_up_again_finds_everything(
    system: System, weights: Path
) -> None:
    system.cli("model", "add", "keep", "--weights", str(weights), "--cpu-cores", "1")
    await wait_ready(system, "keep", 1)
    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)
    client.chat.completions.create(model="keep", messages=[{"role": "user", "content": "one"}])
    wait_for(lambda: "keep" in system.cli("usage").stdout, 15, "usage for keep")
    key = system.api_key

    assert system.stop() == 0
    assert system.engine_processes(str(weights)) == []
    for name in ("temporal", "control", "agent", "gateway"):
        assert not (system.state_dir / "run" / f"{name}.pid").exists() or name == "temporal"

    system.start(timeout=120)
    assert system.api_key == key
    # The banner promises an API that answers: asked at once, with no wait (CI once saw the
    # banner before the gateway listened, and a client's first call refused).
    assert httpx.get(system.base_url.removesuffix("/v1") + "/healthz").status_code == 200
    await wait_ready(system, "keep", 1, timeout=90)
    reply = client.chat.completions.create(
        model="keep", messages=[{"role": "user", "content": "two"}]
    )
    assert reply.choices[0].message.content
    assert "keep" in system.cli("model", "list").stdout
    wait_for(
        lambda: any(
            line.split()[2:4] == ["keep", "2"] for line in system.cli("usage").stdout.splitlines()
        ),
        15,
        "usage to add up across the restart",
    )
