"""llama.cpp's llama-server: the command line and environment for one replica. Pure.

Only flags that `llama-server --help` of the pinned build lists are used; anything else makes
the server exit at start-up with "invalid argument".
"""

from __future__ import annotations

from workflows.contracts import ModelSpec

# The default version lives with the cluster's engine plan (workflows may not import
# activities); re-exported here for the agent's callers.
from workflows.engine_plan import LLAMACPP as ENGINE
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION

__all__ = ["API_KEY_ENV", "ENGINE", "LLAMACPP_DEFAULT_VERSION", "command_line", "engine_env"]
API_KEY_ENV = "LLAMA_API_KEY"

# Flags llmgw itself decides. An operator's extra args may not override them: a second --port
# would make the engine listen where nothing routes, and --api-key would put a secret on the
# command line, which every user of the node can read in /proc.
RESERVED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--api-key",
        "--api-key-file",
        "-m",
        "--model",
        "--metrics",
        "-a",
        "--alias",
    }
)


def command_line(binary: str, model: ModelSpec, host: str, port: int, threads: int) -> list[str]:
    """argv for llama-server serving `model` on host:port with `threads` CPU threads.

    Host and port are always explicit because their defaults changed across builds.
    """
    clash = sorted({arg.split("=", 1)[0] for arg in model.args} & RESERVED_FLAGS)
    if clash:
        raise ValueError(
            f"model {model.name}: args may not set {', '.join(clash)}; llmgw sets them itself"
        )
    return [
        binary,
        "--host",
        host,
        "--port",
        str(port),
        "--metrics",
        "-m",
        model.weights,
        # Responses and /v1/models name the model as clients asked for it, not by file path.
        "--alias",
        model.name,
        "-c",
        str(model.context_size),
        "-np",
        str(model.parallel),
        "-t",
        str(threads),
        *model.args,
    ]


def engine_env(key: str) -> dict[str, str]:
    """The engine key travels in the environment, readable only by the process's own user."""
    return {API_KEY_ENV: key}
