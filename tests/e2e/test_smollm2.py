"""End to end: `llmgw up` as a new user runs it, serving the real SmolLM2-135M through the real
llama-server, used through the `openai` client, and last behind a second gateway as well. The
stand-in engine plays no part here.

The first run on a machine builds llama-server from source (cached afterwards in
~/.cache/llmgw or $LLMGW_CACHE_DIR); the fixture allows for that."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.ports import free_port
from tests.system import REPO, System, wait_for, wait_ready
from workers.demo import DEMO_MODEL, demo_weights

pytestmark = [pytest.mark.e2e, pytest.mark.long]

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


async def test_plain_and_streamed_chat_with_usage_recorded(
    system: System, client: openai.OpenAI
) -> None:
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


async def test_a_flooding_key_does_not_hold_another_keys_request_behind_its_own(
    system: System,
) -> None:
    """The demo's llama-server runs two requests at once. One key sends twelve; another key's
    request sent a moment later is answered once a slot frees for it, not after the flood."""
    await wait_ready(system, DEMO_MODEL, 1)
    flood_key = system.cli("key", "create", "e2e-flood").stdout.strip().splitlines()[-1]
    chat_key = system.cli("key", "create", "e2e-chat").stdout.strip().splitlines()[-1]
    await asyncio.sleep(2)  # the gateway reads new keys within a second
    finished: list[str] = []

    async def one(key: str, name: str, max_tokens: int, priority: str) -> None:
        async with openai.AsyncOpenAI(
            base_url=system.base_url, api_key=key, max_retries=0, timeout=600
        ) as client:
            await client.chat.completions.create(
                model=DEMO_MODEL,
                messages=[{"role": "user", "content": f"Write a long story ({name})."}],
                max_tokens=max_tokens,
                extra_headers={"x-llmgw-priority": priority},
            )
        finished.append(name)

    # Batch class: the flood may wait in the queue past the 60 s of the others on a loaded
    # machine (batch_queue_deadline_s, 600 s). 64 tokens each: the chat request waits for a
    # flood request to end, which at 256 tokens took past its own 60 s on a loaded machine.
    flood = [asyncio.create_task(one(flood_key, f"flood {i}", 64, "batch")) for i in range(12)]
    await asyncio.sleep(1.5)  # the flood runs
    done_before = len(finished)
    try:
        await one(chat_key, "chat", 8, "interactive")
    except openai.InternalServerError as exc:
        # On a loaded machine the two flood requests running may outlast the chat request's
        # 60 s in the queue (seen twice in fresh-clone runs on a slow VM: 503, the replicas
        # stayed busy). Sent again, as a client would, it must still come before the flood's
        # waiting requests: a freed slot given to the flood instead fails the order below.
        if exc.status_code != 503:
            raise
        await one(chat_key, "chat", 8, "interactive")
    await asyncio.gather(*flood)
    # In arrival order it would follow every flood request still waiting (eight or more). The
    # gateway sends the replica no more than its two slots (its route says so), so the flood
    # requests that end before it are the two running when it came, and at most one more that
    # ended while its request was on its way (the client's setup and connection: the test
    # cannot see when the gateway queued it; seen once in a fresh-clone run).
    assert done_before < 10, "the flood was over before the chat request came"
    assert finished.index("chat") - done_before <= 3, finished


async def test_killed_engine_recovers(system: System, client: openai.OpenAI) -> None:
    await wait_ready(system, DEMO_MODEL, 1)
    replica = f"{DEMO_MODEL}-0"
    first = system.engine_pid(replica)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: system.engine_pid(replica) not in (None, first), 60, "a new llama-server")
    await wait_ready(system, DEMO_MODEL, 1, timeout=120)
    assert ask(client, "Say hello.").strip()
    assert len(system.engine_processes(str(demo_weights()))) == 1


async def test_killed_control_worker_recovers(system: System, client: openai.OpenAI) -> None:
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


# --- behind two gateways: up's and a second `llmgw gateway --workers 2` (gateway/peers/) ---

SYSTEM_PROMPT = (
    "You are the help desk of a bicycle shop in a small town. You answer questions about "
    "repairs, parts, prices and opening hours, briefly and politely. "
) * 8


class SecondGateway:
    """`llmgw gateway --workers 2` on the system's state directory: the same store and keys."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.port = free_port()
        self.admin_port = free_port()
        while self.admin_port + 1 in (self.port, system.port, system.admin_port):
            self.admin_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "workers.cli", "gateway", "--workers", "2"]
        command += ["--port", str(self.port), "--admin-port", str(self.admin_port)]
        log = open(self.system.state_dir / f"second-gateway-{time.time():.0f}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            command, cwd=REPO, env=self.system.env(), stdout=log, stderr=subprocess.STDOUT
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def admin(self, worker: int) -> str:
        return f"http://127.0.0.1:{self.admin_port + worker}"

    def decisions(self) -> dict[str, float]:
        """Its routing decisions by reason, both workers together."""
        found: dict[str, float] = {}
        for worker in (0, 1):
            text = httpx.get(self.admin(worker) + "/metrics", timeout=5).text
            for line in text.splitlines():
                if line.startswith("llmgw_routing_decisions_total{") and 'reason="' in line:
                    reason = line.split('reason="', 1)[1].split('"', 1)[0]
                    found[reason] = found.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        return found

    def all_heard(self) -> bool:
        """Both workers hear both other gateway processes (up's gateway and each other)."""
        try:
            for worker in (0, 1):
                peers = httpx.get(self.admin(worker) + "/healthz", timeout=2).json()["peers"]
                if len(peers) != 2 or not all(peers.values()):
                    return False
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return True


def ask_desk(base_url: str, api_key: str, question: str) -> None:
    """A question to the help desk of SYSTEM_PROMPT, through the gateway at `base_url`."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=DEMO_MODEL,
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        max_tokens=4,
    )
    assert reply.choices[0].message.content is not None


async def test_a_second_gateway_follows_the_first_and_starts_warm_after_a_restart(
    system: System,
) -> None:
    await wait_ready(system, DEMO_MODEL, 1)
    second = SecondGateway(system)
    second.start()
    try:
        wait_for(second.all_heard, 60, "the second gateway's workers to hear every peer")
        ask_desk(system.base_url, system.api_key, "When do you open on Saturdays?")
        time.sleep(0.5)  # the first gateway tells the others within a flush (10 ms)
        # Each worker of the second gets a connection of its own now and then: ask a few times.
        for n in range(4):
            ask_desk(f"http://127.0.0.1:{second.port}/v1", system.api_key, f"Tyres, {n}?")
        decisions = second.decisions()
        # One replica: a prompt this gateway never saw is a new prefix, one it heard of a prefix.
        assert decisions.get("prefix", 0) == 4, decisions
        assert decisions.get("new_prefix", 0) == 0, decisions

        second.stop()
        second.start()
        wait_for(second.all_heard, 60, "the restarted gateway's workers to hear every peer")
        ask_desk(f"http://127.0.0.1:{second.port}/v1", system.api_key, "Do you sell helmets?")
        decisions = second.decisions()
        assert decisions == {**{r: 0.0 for r in decisions}, "prefix": 1.0}, decisions
    finally:
        second.stop()


def test_the_second_gateway_left_no_peer_row_behind(system: System) -> None:
    """Stopped cleanly, a gateway process withdraws from the store's peer table: the first
    gateway lists no peer within the 3 s a stale row would otherwise last."""

    def alone() -> bool:
        peers: dict[str, object] = httpx.get(
            f"http://127.0.0.1:{system.admin_port}/healthz", timeout=2
        ).json()
        return peers["peers"] == {}

    wait_for(alone, 5, "the first gateway to list no peer")
