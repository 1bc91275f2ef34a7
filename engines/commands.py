"""How one shard of a replica is launched on its node: an ordered list of commands. Pure.

Every command but the last is a sidecar, kept alive for the shard's lifetime and torn down with
it (a Ray head or join, a key guard); the last one's exit is the shard's. A command may need a
rendezvous point listening before it starts (a Ray join needs the leader's head): `wait_for`
names it, and the launcher waits for it, bounded, so a head that never appears fails the shard
rather than hanging it. A command may also be started without some of the shard's environment
(`env_drop`): a key meant for a sidecar alone (TensorRT-LLM's key guard) stays out of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# How long the launcher waits for a command's `wait_for` point (a Ray head) to listen.
RENDEZVOUS_WAIT_S = 300.0


@dataclass(frozen=True)
class Command:
    argv: list[str]
    # (host, port) that must accept TCP connections before this command starts.
    wait_for: tuple[str, int] | None = None
    # Names of the shard's environment this command is started without.
    env_drop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShardPlace:
    """Where one shard runs and how it finds the others."""

    address: str  # this node's own address: the engine listens here, never on 0.0.0.0
    port: int  # this shard's port (only the leader's serves HTTP)
    rank: int = 0  # 0 is the leader
    nodes: int = 1
    leader_address: str = ""  # the rank 0 node's address; "" on a single node
    # On the leader: vLLM's --master-port, or the Ray head's port. Not the HTTP port.
    rendezvous_port: int = 0
    gpus: list[str] = field(default_factory=list)  # this shard's GPU UUIDs
    cpu_cores: int = 0

    @property
    def leader(self) -> str:
        return self.leader_address or self.address

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def check_reserved(model: str, args: list[str], reserved: frozenset[str]) -> None:
    """Refuse operator args that would take over a flag llmgw sets itself."""
    clash = sorted({arg.split("=", 1)[0] for arg in args} & reserved)
    if clash:
        raise ValueError(
            f"model {model}: args may not set {', '.join(clash)}; llmgw sets them itself"
        )


def tcp_endpoint(host: str, port: int) -> str:
    """A ZMQ tcp endpoint; IPv6 addresses go in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
