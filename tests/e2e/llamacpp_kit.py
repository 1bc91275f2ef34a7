"""The real llama-server for end-to-end tests."""

from __future__ import annotations

from pathlib import Path

from engines.build_llamacpp import build_llamacpp
from workers.paths import default_cache_dir
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION


def llama_server() -> Path:
    """The real llama-server, from the build the agent's installer caches (built here on a
    machine that has none yet, as the first `llmgw up` would)."""
    dist = build_llamacpp(LLAMACPP_DEFAULT_VERSION, default_cache_dir(), lambda _: None)
    return dist / "llama-server"
