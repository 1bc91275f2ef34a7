"""The LiteLLM proxy arm: its own virtual environment (built once, then reused), config-file
mode, one model pointing at the stand-in as an OpenAI-compatible endpoint, a master key, no
database.

The environment lives in ~/.cache/llmgw/bench/litellm-venv (peer_venv.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.gateway import peer_venv
from bench.gateway.procs import Child, environment

VENV_DIR = peer_venv.CACHE_DIR / "litellm-venv"
REQUIREMENT = "litellm[proxy]"
MASTER_KEY = "sk-llmgw-bench-master"
MODEL = "mock"
HEALTH_PATH = "/health/liveliness"
# Its first start imports a lot and builds its routers: tens of seconds on a small machine.
START_TIMEOUT_S = 180.0


def ensure_installed(venv: Path = VENV_DIR) -> Path:
    """The `litellm` executable, installing it on first use (a few minutes)."""
    return peer_venv.ensure_installed(venv, REQUIREMENT, "litellm", "LiteLLM")


def config(upstream: str) -> dict[str, object]:
    return {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": upstream.rstrip("/") + "/v1",
                    "api_key": "sk-standin",
                },
            }
        ],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"telemetry": False, "set_verbose": False},
    }


def start(exe: Path, upstream: str, port: int, workdir: Path, cpu: int | None) -> Child:
    config_file = workdir / "litellm.yaml"
    config_file.write_text(yaml.safe_dump(config(upstream), sort_keys=False))
    env = environment(
        # No network here: never fetch the model price map from GitHub at start-up.
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        LITELLM_TELEMETRY="False",
    )
    # No database: key checks against the master key only, no spend logs.
    for name in ("DATABASE_URL", "LITELLM_DATABASE_URL"):
        env.pop(name, None)
    argv = [str(exe), "--config", str(config_file), "--host", "127.0.0.1", "--port", str(port)]
    child = Child("litellm", argv, workdir / "litellm.log", cpu, env)
    return peer_venv.serving(child, port, HEALTH_PATH, START_TIMEOUT_S, 0.5)


def version(venv: Path = VENV_DIR) -> str:
    return peer_venv.version(venv, "litellm", LITELLM_LOCAL_MODEL_COST_MAP="True")
