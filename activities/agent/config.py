"""What the node agent is started with: its node and address, where it keeps its state, its
node secret, the engine binaries an operator configured, and its KV feed's port."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engines.adapter import InstallPlace
from engines.install_llamacpp import nvidia_driver_loaded
from workflows.addresses import http_base


@dataclass
class AgentConfig:
    node: str
    address: str
    state_dir: Path
    cache_dir: Path
    node_secret: bytes = field(repr=False)
    # engine name -> an operator-provided binary used instead of an installed one.
    engine_paths: dict[str, str] = field(default_factory=dict)
    supervise_poll_s: float = 2.0
    ready_poll_s: float = 0.5
    stop_grace_s: float = 10.0
    # Whether an NVIDIA driver is loaded here; None: look in /proc when asked.
    nvidia: bool | None = None
    # The port of this agent's KV feed (kv/feed_server.py) on `address`; 0: no feed, and
    # launches report no KV source, so gateways route those replicas by their own index.
    kv_feed_port: int = 0
    # The control plane's mirror (activities/control/mirror_server.py) as this node reaches it,
    # for fetch requests that name none; "": only requests that name one can fetch.
    mirror: str = ""
    # Where this agent serves its Prometheus metrics (node_metrics.py), as discovery reports
    # it in the inventory for `llmgw nodes` and `llmgw top`; "": not served.
    metrics_url: str = ""
    # `llmgw agent --install-os-packages`: an engine's missing libraries may be installed from
    # this node's package sources (engines/os_packages.py).
    install_os_packages: bool = False

    @property
    def has_nvidia(self) -> bool:
        return nvidia_driver_loaded() if self.nvidia is None else self.nvidia

    @property
    def engines_root(self) -> Path:
        return self.state_dir / "engines"

    @property
    def artifacts_root(self) -> Path:
        """Where the artifacts fetched from the mirror are (activities/agent/artifact_fetch.py)."""
        return self.state_dir / "artifacts"

    @property
    def install_place(self) -> InstallPlace:
        return InstallPlace(
            self.engines_root, self.cache_dir, self.has_nvidia, self.install_os_packages
        )

    @property
    def agent_dir(self) -> Path:
        return self.state_dir / "agent" / self.node

    @property
    def secrets_dir(self) -> Path:
        """Secrets engines' env references by name (activities/agent/node_secrets.py)."""
        return self.agent_dir / "secrets"

    def http_base(self, port: int) -> str:
        """http://<address>:<port> for something served on this node's address (an IPv6
        address in brackets)."""
        return http_base(self.address, port)
