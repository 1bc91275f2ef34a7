"""The real llama-server replicas `bench.routing` measures: found in the build cache `llmgw`
fills, started one per key on free ports, waited on until healthy, and read for their prompt
token counters."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from engines.build_llamacpp import BINARY, cached_dist
from engines.local_port import free_port
from engines.metrics import totals
from workers.demo import demo_weights
from workers.paths import default_cache_dir
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION

HEALTH_TIMEOUT_S = 120.0
PROCESSED = "llamacpp:prompt_tokens_total"
CACHED = "llamacpp:prompt_tokens_cached_total"


class EngineShape(Protocol):
    """How each engine runs (bench.routing_workload's BenchConfig)."""

    @property
    def parallel(self) -> int: ...
    @property
    def context(self) -> int: ...
    @property
    def threads(self) -> int: ...


def llama_server_binary() -> Path:
    """$LLMGW_LLAMA_SERVER, else the build cache `llmgw` fills (engines/
    build_llamacpp.py), else one on PATH."""
    named = os.environ.get("LLMGW_LLAMA_SERVER")
    if named:
        return Path(named)
    dist = cached_dist(default_cache_dir(), LLAMACPP_DEFAULT_VERSION)
    if dist is not None:
        return dist / BINARY
    found = shutil.which(BINARY)
    if found:
        return Path(found)
    raise SystemExit(
        f"no {BINARY}: build one with `llmgw up` (it fills the cache under "
        f"{default_cache_dir()}/llamacpp) or set LLMGW_LLAMA_SERVER"
    )


@dataclass(frozen=True)
class Engine:
    replica_id: str
    url: str
    key: str
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.asynccontextmanager
async def engines(
    shape: EngineShape, keys: Sequence[str], extra: Sequence[str], logs: Path
) -> AsyncIterator[list[Engine]]:
    """Start one llama-server per key, wait until each is healthy, stop them all on exit."""
    binary, weights = llama_server_binary(), demo_weights()
    started: list[Engine] = []
    try:
        for index, key in enumerate(keys):
            port = free_port()
            log = logs / f"engine-{index}-{port}.log"
            command = [str(binary), "-m", str(weights), "--host", "127.0.0.1"]
            command += ["--port", str(port), "--metrics", "--parallel", str(shape.parallel)]
            command += ["-c", str(shape.context), "-t", str(shape.threads), *extra]
            with log.open("wb") as out:
                process = subprocess.Popen(  # noqa: ASYNC220 - start-up only, returns at once
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    # The key through the environment, never on the command line (REFERENCE.md).
                    env={**os.environ, "LLAMA_API_KEY": key},
                )
            replica_id = f"bench-{index}"
            started.append(Engine(replica_id, f"http://127.0.0.1:{port}", key, process, log))
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            for engine in started:
                await _wait_healthy(client, engine)
        yield started
    finally:
        for engine in started:
            engine.process.terminate()
        for engine in started:
            try:
                await asyncio.to_thread(engine.process.wait, 10)
            except subprocess.TimeoutExpired:
                engine.process.kill()


async def _wait_healthy(client: httpx.AsyncClient, engine: Engine) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            tail = engine.log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"llama-server exited ({engine.process.returncode}):\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(engine.url + "/health")).status_code == 200:
                return
        await asyncio.sleep(0.25)
    raise SystemExit(f"llama-server at {engine.url} not healthy after {HEALTH_TIMEOUT_S:.0f}s")


async def prompt_counters(
    client: httpx.AsyncClient, engine_list: Sequence[Engine]
) -> list[tuple[float, float]]:
    """(cached, computed) prompt tokens of each engine, in `engine_list`'s order."""
    found: list[tuple[float, float]] = []
    for engine in engine_list:
        response = await client.get(
            engine.url + "/metrics", headers={"Authorization": f"Bearer {engine.key}"}
        )
        response.raise_for_status()
        counters = totals(response.text, (CACHED, PROCESSED))
        found.append((counters[CACHED], counters[PROCESSED]))
    return found
