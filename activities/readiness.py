"""Is an engine ready to serve? Two questions, asked in order.

`/health` says the process is up (llama-server answers 503 while loading); `/v1/models` with the
engine key says the weights are loaded and the key is the one the gateway will send. Routing on
/health alone sends traffic into a model that is still loading.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from workflows.contracts import ReadyResult

POLL_S = 0.5
REQUEST_TIMEOUT_S = 5.0


async def _probe(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    """'' when the endpoint answered 200, else what it said (for the timeout message)."""
    try:
        response = await client.get(url, headers=headers)
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}".rstrip(": ")
    if response.status_code == 200:
        return ""
    return f"HTTP {response.status_code} {response.text[:200]}".strip()


async def wait_ready(
    port: int,
    key: str,
    timeout_s: float,
    heartbeat: Callable[[], None],
    is_alive: Callable[[], bool],
    poll_s: float = POLL_S,
    host: str = "127.0.0.1",
) -> ReadyResult:
    base = f"http://{host}:{port}"
    steps: tuple[tuple[str, dict[str, str]], ...] = (
        ("/health", {}),
        ("/v1/models", {"Authorization": f"Bearer {key}"}),
    )
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for path, headers in steps:
            last = "no answer yet"
            while True:
                heartbeat()
                if not is_alive():
                    return ReadyResult(
                        ready=False,
                        detail=f"engine process exited while loading (last {path}: {last})",
                    )
                last = await _probe(client, base + path, headers)
                if not last:
                    break
                if time.monotonic() >= deadline:
                    return ReadyResult(
                        ready=False,
                        detail=f"not ready after {timeout_s:.0f}s: {path} answered {last}",
                    )
                await asyncio.sleep(poll_s)
    return ReadyResult(ready=True, detail="/health and /v1/models answered 200")
