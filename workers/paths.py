"""Where llmgw keeps things on this machine, and how a process finds the rest of the system.

Everything comes from flags first, then the environment, then a default, so one set of
environment variables points every command (`up`, `agent`, `key create` ...) at the same place.
"""

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from workers.temporal_flags import namespace_from, security_from
from workflows.client import DEFAULT_TEMPORAL_ADDRESS, PLAINTEXT
from workflows.names import reserved_node_name
from workflows.temporal_security import TemporalSecurity


def default_state_dir() -> Path:
    env = os.environ.get("LLMGW_STATE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw"


def default_cache_dir() -> Path:
    """Engine builds live here rather than in a state dir: a llama.cpp build takes many minutes
    and is the same for every state dir on this machine."""
    env = os.environ.get("LLMGW_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw"


def default_node_name() -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")
    if reserved_node_name(name) is not None:
        return f"{name}-node"  # a machine named "external" is still a node
    return name or "node"


@dataclass(frozen=True)
class Locations:
    state_dir: Path
    cache_dir: Path
    temporal: str
    namespace: str
    database_url: str | None
    # TLS and API-key settings: file paths, never a secret's value (workflows/temporal_security.py).
    security: TemporalSecurity = PLAINTEXT

    @classmethod
    def resolve(
        cls,
        state_dir: str | None = None,
        temporal: str | None = None,
        database_url: str | None = None,
        namespace: str | None = None,
        security: TemporalSecurity | None = None,
    ) -> "Locations":
        """Raises TemporalSecurityError (a ValueError) for TLS settings that cannot work."""
        return cls(
            state_dir=Path(state_dir).expanduser() if state_dir else default_state_dir(),
            cache_dir=default_cache_dir(),
            temporal=temporal or os.environ.get("LLMGW_TEMPORAL_ADDRESS", DEFAULT_TEMPORAL_ADDRESS),
            namespace=namespace or namespace_from(None, os.environ),
            database_url=database_url or os.environ.get("LLMGW_DATABASE_URL") or None,
            security=security if security is not None else security_from(None, os.environ),
        )

    def config_file(self, given: str | None = None) -> Path | None:
        """The server configuration (`engines:`, `nodes_file:`, schedules): a flag, then
        $LLMGW_CONFIG, then llmgw.yaml in the state dir if there is one; None: defaults."""
        named = given or os.environ.get("LLMGW_CONFIG")
        if named:
            return Path(named).expanduser().absolute()
        default = self.state_dir / "llmgw.yaml"
        return default if default.exists() else None

    @property
    def models_dir(self) -> Path:
        """Weights llmgw keeps itself (`llmgw model import-ollama`), named by their sha256.
        Absolute: the path goes into a model's spec, read by agents elsewhere."""
        return self.state_dir.absolute() / "models"

    @property
    def mirror_dir(self) -> Path:
        """The control plane's content-addressed model mirror (`llmgw mirror`, docs/models.md)."""
        return self.state_dir.absolute() / "mirror"

    def node_secret_file(self, node: str) -> Path:
        return self.state_dir / "agent" / node / "node.secret"
