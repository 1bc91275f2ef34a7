"""The stand-in engine speaks llama-server's surface closely enough for the gateway's tests."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "standin_engine.py"
KEY = "llmgw-engine-standin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def wait_healthy(base: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("stand-in never became healthy")


def run_standin(
    tmp_path: Path, extra_env: dict[str, str] | None = None, delay: str = "0.3"
) -> tuple[subprocess.Popen[bytes], str]:
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(STANDIN),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-m",
            str(weights),
            "-c",
            "4096",
            "-np",
            "2",
            "-t",
            "2",
            "--metrics",
            "--load-delay",
            delay,
        ],
        env={"LLAMA_API_KEY": KEY, "PATH": "/usr/bin:/bin", **(extra_env or {})},
    )
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[str]:
    proc, base = run_standin(tmp_path)
    try:
        wait_healthy(base)
        yield base
    finally:
        proc.kill()
        proc.wait()


def sse_events(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


def test_version_goes_to_stderr_like_llama_server() -> None:
    done = subprocess.run(
        [str(ROOT / "standin_llama_server"), "--version", "-c", "4096"],
        capture_output=True,
        text=True,
        env={"STANDIN_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0
    assert done.stderr.startswith("version: ")
    assert done.stdout == ""


def test_loading_then_ready_and_keys(tmp_path: Path) -> None:
    proc, base = run_standin(tmp_path, delay="1.0")
    try:
        deadline = time.monotonic() + 10
        first = None
        while first is None and time.monotonic() < deadline:
            try:
                first = httpx.get(f"{base}/health")
            except httpx.HTTPError:
                time.sleep(0.05)
        assert first is not None
        assert first.status_code == 503
        assert httpx.get(f"{base}/v1/models", headers=AUTH).status_code == 503
        wait_healthy(base)
        assert httpx.get(f"{base}/health").json() == {"status": "ok"}
        assert httpx.get(f"{base}/v1/models").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(f"{base}/metrics", headers=wrong).status_code == 401
        models = httpx.get(f"{base}/v1/models", headers=AUTH).json()
        assert [m["id"] for m in models["data"]] == ["tiny.gguf"]
    finally:
        proc.kill()
        proc.wait()


def test_chat_reply_is_deterministic_with_usage(standin: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there engine"}]}
    first = httpx.post(f"{standin}/v1/chat/completions", json=body, headers=AUTH).json()
    second = httpx.post(f"{standin}/v1/chat/completions", json=body, headers=AUTH).json()
    assert first["choices"][0]["message"]["content"] == "echo: hello there engine"
    assert second["choices"][0]["message"] == first["choices"][0]["message"]
    assert first["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert first["object"] == "chat.completion"
    assert first["model"] == "tiny"


def test_chat_stream_with_usage_then_done(standin: str) -> None:
    body = {
        "model": "tiny",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "one two three"}],
    }
    response = httpx.post(f"{standin}/v1/chat/completions", json=body, headers=AUTH)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "echo: one two three"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"


def test_stream_without_include_usage_has_no_usage(standin: str) -> None:
    body = {"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{standin}/v1/chat/completions", json=body, headers=AUTH)
    chunks = [json.loads(e) for e in sse_events(response.text)[:-1]]
    assert all("usage" not in c for c in chunks)


def test_completions_plain_stream_and_max_tokens(standin: str) -> None:
    plain = httpx.post(
        f"{standin}/v1/completions",
        json={"prompt": "a b c d e", "max_tokens": 3},
        headers=AUTH,
    ).json()
    assert plain["choices"][0]["text"] == "echo: a b"
    assert plain["choices"][0]["finish_reason"] == "length"
    assert plain["usage"]["completion_tokens"] == 3
    streamed = httpx.post(
        f"{standin}/v1/completions", json={"prompt": "x y", "stream": True}, headers=AUTH
    )
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == "echo: x y"


def test_metrics_count_tokens(standin: str) -> None:
    body = {"messages": [{"role": "user", "content": "count these four words"}]}
    httpx.post(f"{standin}/v1/chat/completions", json=body, headers=AUTH)
    text = httpx.get(f"{standin}/metrics", headers=AUTH).text
    values = dict(
        line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert values["llamacpp:prompt_tokens_total"] == "4"
    assert values["llamacpp:tokens_predicted_total"] == "5"
    assert values["llamacpp:requests_processing"] == "0"
    assert values["llamacpp:requests_deferred"] == "0"


def read_stream(url: str, body: object, into: list[str]) -> None:
    """POST a streaming request and keep each chunk of text as it arrives, until it ends or
    breaks (the chunks read before a break stay in `into`)."""
    with httpx.stream("POST", url, json=body, headers=AUTH) as response:
        for chunk in response.iter_text():
            into.append(chunk)


def test_die_after_chunks_cuts_the_stream_and_exits(tmp_path: Path) -> None:
    proc, base = run_standin(tmp_path, {"STANDIN_DIE_AFTER_CHUNKS": "2"})
    try:
        wait_healthy(base)
        body = {"stream": True, "messages": [{"role": "user", "content": "a b c d e f"}]}
        chunks: list[str] = []
        with pytest.raises(httpx.HTTPError):
            read_stream(f"{base}/v1/chat/completions", body, chunks)
        received = "".join(chunks)
        assert len(sse_events(received)) == 2
        assert "[DONE]" not in received
        assert proc.wait(timeout=10) == 1
    finally:
        proc.kill()
        proc.wait()
