"""The parts of a shard's launch that are the same for every engine: the ports it uses besides
its HTTP port, whether the ones it binds are free, and how its commands are run.

Ports come from placement (ShardAllocation.extra_ports, by the names in
workflows/placement/ports.py): the leader's rendezvous point, which every shard of a multi-node
replica reads, and vLLM's KV-event ports (the leader binds the replay port; the node agent's
subscriber binds the publisher's, which must be free or the agent's own). Allocations placed before
placement handed these out (their leader has no extra_ports at all) are still carried by
replica workflows that have held them since, and an engine restart launches with the same
allocation again: for those alone the ports are derived from the HTTP port, as they were then.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from temporalio.exceptions import ApplicationError

from engines.commands import RENDEZVOUS_WAIT_S, Command
from workflows.contracts import Profile, ShardAllocation
from workflows.placement.ports import (
    ENGINE_INNER,
    KV_PUB,
    KV_REPLAY,
    RENDEZVOUS,
    extra_port_names,
)

LAUNCHER = Path(__file__).resolve().parent / "shard_launcher.py"
LOOPBACK = "127.0.0.1"
# How ports were derived from the HTTP port before placement handed them out: above the node's
# range, so placement never gave them to another shard. Only for those old allocations.
# (ENGINE_INNER is newer than placement's extra ports, but a TensorRT-LLM replica placed before
# it has none at all, so it is derived the same way.)
LEGACY_PORT_OFFSETS = {RENDEZVOUS: 10000, KV_PUB: 11000, KV_REPLAY: 12000, ENGINE_INNER: 13000}


# Where a shard binds each port. vLLM's KV-event ports and trtllm-serve's inner port behind its
# key guard are on loopback whatever the node's address (engines/vllm.py, engines/trtllm.py).
# The rendezvous point (Ray's head, torch's store) listens on every address. The HTTP port is
# on the node's address.
ON_LOOPBACK = frozenset({KV_PUB, KV_REPLAY, ENGINE_INNER})
ON_EVERY_ADDRESS = frozenset({RENDEZVOUS})


@dataclass(frozen=True)
class ShardPorts:
    # Every port this shard's commands name besides its HTTP port, by placement's names.
    by_name: dict[str, int]
    # The ports this shard itself binds, its HTTP port included: each must be free to start.
    binds: list[int]

    def host_of(self, port: int, address: str) -> str:
        """Where the shard binds `port`: loopback, every address, or the node's address."""
        if any(self.by_name.get(name) == port for name in ON_LOOPBACK):
            return LOOPBACK
        if any(self.by_name.get(name) == port for name in ON_EVERY_ADDRESS):
            return "::" if ":" in address else "0.0.0.0"
        return address


def shard_ports(
    shard: ShardAllocation, leader: ShardAllocation, profile: Profile, rank: int
) -> ShardPorts:
    """This shard's ports, as placement handed them out. A port the profile needs that the
    allocation lacks fails the launch (non-retryable, naming it), except in an allocation from
    before placement handed any out, where it is derived as it was then."""
    own = extra_port_names(profile, rank)
    # Workers bind nothing extra; they connect to the leader's rendezvous point.
    read = [RENDEZVOUS] if profile.nodes > 1 and RENDEZVOUS not in own else []
    legacy = not leader.extra_ports
    by_name: dict[str, int] = {}
    for name, owner in [*((n, shard) for n in own), *((n, leader) for n in read)]:
        port = owner.extra_ports.get(name)
        if port is None and legacy:
            port = owner.port + LEGACY_PORT_OFFSETS[name]
        if port is None:
            raise ApplicationError(
                f"the allocation gives shard {owner.rank} on node {owner.node} no {name} port; "
                "placement hands one out to every shard that needs it",
                type="PortMissing",
                non_retryable=True,
            )
        by_name[name] = port
    return ShardPorts(by_name, sorted({shard.port, *(by_name[name] for name in own)}))


def port_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` (ShardPorts.host_of). A program listening on the
    wildcard address takes it on every host; one listening on another address of the machine
    takes it only on the wildcard: several agents on one machine, each on an address of its own
    (the test fleets), use the same port numbers without meeting."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        # A socket of a stopped engine still in TIME_WAIT does not hold the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _planned(command: Command) -> dict[str, object]:
    planned: dict[str, object] = {"argv": command.argv, "wait_for": command.wait_for}
    if command.env_drop:
        planned["env_drop"] = list(command.env_drop)
    return planned


def launch_argv(commands: list[Command], wait_s: float = RENDEZVOUS_WAIT_S) -> list[str]:
    """One command as itself; sidecars, or a wait for a rendezvous point, through the shard
    launcher, which leads the process group they all share (so a stop reaches every one)."""
    if len(commands) == 1 and commands[0].wait_for is None and not commands[0].env_drop:
        return list(commands[0].argv)
    plan = {"commands": [_planned(c) for c in commands], "wait_s": wait_s}
    return [sys.executable, "-I", str(LAUNCHER), json.dumps(plan, separators=(",", ":"))]
