"""Is an engine ready to serve? Two questions, asked in order, and a third on GPUs.

`/health` says the process is up (llama-server answers 503 while loading); `/v1/models` with the
engine key says the weights are loaded and the key is the one the gateway will send. Routing on
/health alone sends traffic into a model that is still loading. Each engine's row declares the
paths (workflows/contracts/engine_facts.py, Readiness); the asking is the agent's, here.

A shard on GPUs must also hold memory on every one of them: a CUDA engine whose backend could
not load (a llama.cpp build missing its CUDA runtime, say) runs on the CPU without an error,
answering both questions above, hundreds of times slower.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import httpx

from engines.adapter import Readiness
from workflows.addresses import http_base
from workflows.contracts import ReadyResult

POLL_S = 0.5
REQUEST_TIMEOUT_S = 5.0
# What every engine llmgw runs answers today (each row's Readiness).
HEALTH_THEN_MODELS = Readiness()


async def _probe(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    """'' when the endpoint answered 200, else what it said (for the timeout message)."""
    try:
        response = await client.get(url, headers=headers)
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}".rstrip(": ")
    if response.status_code == 200:
        return ""
    return f"HTTP {response.status_code} {response.text[:200]}".strip()


# nvidia-smi's per-process view of GPU memory: one line per process per GPU.
COMPUTE_APPS_QUERY = [
    "nvidia-smi",
    "--query-compute-apps=pid,gpu_uuid,used_memory",
    "--format=csv,noheader,nounits",
]
NVIDIA_SMI_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ComputeApp:
    pid: int
    gpu_uuid: str
    used_memory_mb: int


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """Rows of `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,
    nounits`: "12345, GPU-5b2c..., 40511". Memory nvidia-smi cannot read (MIG without
    privileges, some containers) is "[N/A]" or "[Insufficient Permissions]": read as 0, which
    the check below reports rather than trusts."""
    apps = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3 or not cells[0].isdigit() or not cells[1]:
            continue
        memory = cells[2].split()[0] if cells[2] else ""
        apps.append(
            ComputeApp(
                pid=int(cells[0]),
                gpu_uuid=cells[1],
                used_memory_mb=int(memory) if memory.isdigit() else 0,
            )
        )
    return apps


def gpus_without_memory(
    apps: list[ComputeApp], gpu_uuids: list[str], pids: Collection[int]
) -> list[str]:
    """The shard's GPUs on which none of its processes (`pids`: its process group) holds
    memory. Empty when the shard uses every GPU it was given."""
    holding = {app.gpu_uuid for app in apps if app.pid in pids and app.used_memory_mb > 0}
    return [uuid for uuid in gpu_uuids if uuid not in holding]


def gpu_memory_problem(gpu_uuids: list[str], pids: Collection[int], smi_output: str) -> str:
    """'' when every GPU holds memory of the shard's processes, else what is wrong."""
    missing = gpus_without_memory(parse_compute_apps(smi_output), gpu_uuids, pids)
    if not missing:
        return ""
    return (
        f"no process of the engine holds memory on {', '.join(missing)} "
        "(is it computing on the CPU?)"
    )


def query_compute_apps() -> str:
    """nvidia-smi's compute apps, or '' when it cannot be run (which then reads as no memory
    held, and the shard is not ready: a GPU shard on a node where nvidia-smi fails is not one
    to route to)."""
    try:
        done = subprocess.run(
            COMPUTE_APPS_QUERY,
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


async def wait_ready(
    port: int,
    key: str,
    timeout_s: float,
    heartbeat: Callable[[], None],
    is_alive: Callable[[], bool],
    poll_s: float = POLL_S,
    host: str = "127.0.0.1",
    gpu_check: Callable[[], str] | None = None,
    paths: Readiness = HEALTH_THEN_MODELS,
) -> ReadyResult:
    """Ready once `paths`' health and models endpoints (/health and /v1/models) answer 200
    and, when `gpu_check` is given (a shard on GPUs; it returns '' when every GPU holds the
    engine's memory, else the problem), the GPUs are in use. It is run in a thread: it runs
    nvidia-smi."""
    base = http_base(host, port)
    steps: tuple[tuple[str, dict[str, str]], ...] = (
        (paths.health, {}),
        (paths.models, {"Authorization": f"Bearer {key}"}),
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
    answered = f"{paths.health} and {paths.models} answered 200"
    if gpu_check is None:
        return ReadyResult(ready=True, detail=answered)
    while True:
        heartbeat()
        if not is_alive():
            return ReadyResult(ready=False, detail="engine process exited after loading")
        problem = await asyncio.to_thread(gpu_check)
        if not problem:
            return ReadyResult(
                ready=True,
                detail=f"{answered}; every GPU holds engine memory",
            )
        if time.monotonic() >= deadline:
            return ReadyResult(ready=False, detail=f"not ready after {timeout_s:.0f}s: {problem}")
        await asyncio.sleep(poll_s)
