"""End to end: `llmgw up` as a new user runs it, serving the real SmolLM2-135M through the real
llama-server, used through the `openai` client. The stand-in engine plays no part here.

The first run on a machine builds llama-server from source (cached afterwards in
~/.cache/llmgw or $LLMGW_CACHE_DIR); the fixture allows for that."""

import os
import signal
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.system import System, wait_for, wait_ready
from workers.demo import DEMO_MODEL, demo_weights

pytestmark = pytest.mark.e2e

FIRST_BUILD_ALLOWANCE_S = 40 * 60


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    system = System(tmp_path_factory.mktemp("state"), demo=True, engine_path=None)
    system.start(timeout=FIRST_BUILD_ALLOWANCE_S)
    yield system
    if system.process is not None and system.process.poll() is None:
        assert system.stop() == 0
        assert system.engine_processes(str(demo_weights())) == []


@pytest.fixture
def client(system: System) -> openai.OpenAI:
    return openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)


def ask(client: openai.OpenAI, text: str, max_tokens: int = 24) -> str:
    reply = client.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens
    )
    assert reply.model == DEMO_MODEL
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    return reply.choices[0].message.content or ""


def test_the_banner_tells_a_new_user_what_to_type(system: System) -> None:
    text = "\n".join(system.output)
    assert f"{system.base_url}" in text
    assert system.api_key in text
    assert "curl -s" in text
    assert DEMO_MODEL in text


async def test_plain_and_streamed_chat_with_usage_recorded(system: System, client) -> None:
    await wait_ready(system, DEMO_MODEL, 1)
    assert ask(client, "What is the capital of France?").strip()

    stream = client.chat.completions.create(
        model=DEMO_MODEL,
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0

    completion = client.completions.create(model=DEMO_MODEL, prompt="Once upon a", max_tokens=8)
    assert completion.choices[0].text

    def usage_shows_three_requests() -> bool:
        rows = system.cli("usage", "--model", DEMO_MODEL).stdout.splitlines()[1:]
        return any(int(row.split()[3]) >= 3 for row in rows)

    wait_for(usage_shows_three_requests, 15, "three requests in llmgw usage")


async def test_no_key_or_a_wrong_key_is_refused(system: System) -> None:
    body = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=30) as http:
        bare = await http.post(f"{system.base_url}/chat/completions", json=body)
        wrong = await http.post(
            f"{system.base_url}/chat/completions",
            json=body,
            headers={"Authorization": "Bearer " + system.api_key[:-4] + "AAAA"},
        )
    assert bare.status_code == 401
    assert wrong.status_code == 401
    bad = openai.OpenAI(base_url=system.base_url, api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


async def test_killed_engine_recovers(system: System, client) -> None:
    await wait_ready(system, DEMO_MODEL, 1)
    replica = f"{DEMO_MODEL}-0"
    first = system.engine_pid(replica)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: system.engine_pid(replica) not in (None, first), 60, "a new llama-server")
    await wait_ready(system, DEMO_MODEL, 1, timeout=120)
    assert ask(client, "Say hello.").strip()
    assert len(system.engine_processes(str(demo_weights()))) == 1


async def test_killed_control_worker_recovers(system: System, client) -> None:
    await wait_ready(system, DEMO_MODEL, 1)
    os.kill(system.child_pid("control"), signal.SIGKILL)
    wait_for(lambda: any("control exited" in line for line in system.output), 30, "a restart")
    # A change that needs the control worker: scale to zero and back.
    system.cli("model", "scale", DEMO_MODEL, "0")
    wait_for(lambda: not system.engine_processes(str(demo_weights())), 60, "the engine to stop")
    system.cli("model", "scale", DEMO_MODEL, "1")
    await wait_ready(system, DEMO_MODEL, 1, timeout=120)
    assert ask(client, "Name a colour.").strip()
    assert len(system.engine_processes(str(demo_weights()))) == 1
