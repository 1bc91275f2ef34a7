"""The LiteLLM proxy arm: its own virtual environment (built once, then reused), config-file
mode, one model pointing at the stand-in as an OpenAI-compatible endpoint, a master key, no
database.

The environment lives in ~/.cache/llmgw/bench/litellm-venv; a marker file says the install
finished, so an interrupted one is redone rather than trusted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from bench.gateway.procs import Child, environment, http_get, wait_until

VENV_DIR = Path.home() / ".cache" / "llmgw" / "bench" / "litellm-venv"
INSTALLED_MARKER = ".installed"
REQUIREMENT = "litellm[proxy]"
MASTER_KEY = "sk-llmgw-bench-master"
MODEL = "mock"
HEALTH_PATH = "/health/liveliness"
# Its first start imports a lot and builds its routers: tens of seconds on a small machine.
START_TIMEOUT_S = 180.0
INSTALL_TIMEOUT_S = 1800.0


class Unavailable(RuntimeError):
    """The arm cannot run here; the message says why."""


def litellm_bin(venv: Path = VENV_DIR) -> Path:
    return venv / "bin" / "litellm"


def ensure_installed(venv: Path = VENV_DIR) -> Path:
    """The `litellm` executable, installing it on first use (a few minutes)."""
    exe = litellm_bin(venv)
    if (venv / INSTALLED_MARKER).exists() and exe.exists():
        return exe
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log_file = venv.parent / "litellm-install.log"
    print(f"installing {REQUIREMENT} into {venv} (once; a few minutes)", file=sys.stderr)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            REQUIREMENT,
        ],
    ]
    with log_file.open("wb") as log:
        for step in steps:
            try:
                done = subprocess.run(
                    step, stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise Unavailable(f"installing LiteLLM failed: {exc}") from exc
            if done.returncode != 0:
                tail = log_file.read_text(errors="replace").splitlines()[-5:]
                raise Unavailable(
                    f"installing LiteLLM failed ({' '.join(step[:3])} exited "
                    f"{done.returncode}; {log_file}): " + " / ".join(tail)
                )
    if not exe.exists():
        raise Unavailable(f"the install finished but {exe} is missing")
    (venv / INSTALLED_MARKER).touch()
    return exe


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
    try:
        wait_until(child, lambda: http_get(port, HEALTH_PATH)[0] == 200, START_TIMEOUT_S, 0.5)
    except BaseException:
        child.stop()
        raise
    return child


def version(venv: Path = VENV_DIR) -> str:
    python = venv / "bin" / "python"
    try:
        out = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"
