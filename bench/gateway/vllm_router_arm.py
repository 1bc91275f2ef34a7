"""The vLLM router arm: vLLM's router (the `vllm-router` package: a Python launcher, and the
server itself in Rust, on threads of the launcher's process) with the stand-in as its one
worker, in its own virtual environment, ~/.cache/llmgw/bench/vllm-router-venv (peer_venv.py).
It parses each chat request and writes it anew, its defaults filled in, before passing it on;
streamed answers it passes on as they come.

The least per-request work its flags allow: round robin (its default, cache_aware, keeps a
prefix tree per request), retries and the circuit breaker off (they act only on failures, which
the stand-in never returns), errors alone logged (it logs requests at debug level only). What
stays on, as no flag turns it off: a request id per request, the concurrency limiter's token,
its Prometheus metrics (always recorded; the exporter gets a port of its own so two runs never
collide). It has no client authentication at all, so it checks no key: the arm sends the
load generator's bearer and the router passes it on to the stand-in, which accepts any.

Before it serves it waits until its worker answers GET /health (the stand-in does), checking
once a second here instead of its default 30; then it asks again every 60 s. It asks the worker
nothing else.
"""

from __future__ import annotations

from pathlib import Path

from bench.gateway import peer_venv
from bench.gateway.procs import Child
from engines.local_port import free_port

VENV_DIR = peer_venv.CACHE_DIR / "vllm-router-venv"
# The version whose flags this file was written against.
REQUIREMENT = "vllm-router==0.1.17"
EXECUTABLE = "vllm-router"
HEALTH_PATH = "/health"
START_TIMEOUT_S = 60.0


def ensure_installed(venv: Path = VENV_DIR) -> Path:
    """The `vllm-router` executable, installing it on first use."""
    return peer_venv.ensure_installed(venv, REQUIREMENT, EXECUTABLE, "the vLLM router")


def command(exe: Path, upstream: str, port: int, metrics_port: int) -> list[str]:
    return [
        str(exe),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--worker-urls", upstream),
        *("--policy", "round_robin"),
        *("--worker-startup-check-interval", "1"),
        *("--worker-startup-timeout-secs", str(int(START_TIMEOUT_S))),
        "--disable-retries",
        "--disable-circuit-breaker",
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)),
        # Errors only: it takes "warning" but its Rust side reads that as info.
        *("--log-level", "error"),
    ]


def start(exe: Path, upstream: str, port: int, workdir: Path, cpu: int | None) -> Child:
    """The router on `cpu`; pinned before it starts, so its async runtime sizes itself to that
    one core (one worker thread)."""
    argv = command(exe, upstream, port, free_port())
    child = Child("vllm-router", argv, workdir / "vllm-router.log", cpu)
    return peer_venv.serving(child, port, HEALTH_PATH, START_TIMEOUT_S, 0.2)


def version(venv: Path = VENV_DIR) -> str:
    return peer_venv.version(venv, "vllm-router")
