"""Which ports a shard binds, all handed out from its node's range (NodeRecord.port_min..max):
the engine's HTTP port, and on a leader the rendezvous point of a multi-node replica (vLLM's
--master-port, the Ray head, SGLang's --dist-init-addr), vLLM's KV-event publisher and replay
ports, and the loopback port a TensorRT-LLM leader's trtllm-serve listens on behind its key guard
(engines/trtllm.py: the guard holds the HTTP port). Which engines bind which is their row's to
say (workflows/contracts/engine_facts.py: kv_events, leader_ports). Ports an agent found held
by a process outside llmgw are skipped."""

from __future__ import annotations

from collections.abc import Collection

from workflows.contracts import NodeRecord, Profile, engine_facts

# Re-exported: the engines' adapters take their ports by placement's names, from here.
from workflows.contracts.engine_facts import ENGINE_INNER as ENGINE_INNER

RENDEZVOUS = "rendezvous"
KV_PUB = "kv_pub"
KV_REPLAY = "kv_replay"


def extra_port_names(profile: Profile, rank: int) -> list[str]:
    """The ports a shard of this rank binds besides its HTTP port."""
    if rank != 0:
        return []  # workers connect to the leader's rendezvous point; they publish nothing
    names = [RENDEZVOUS] if profile.nodes > 1 else []
    facts = engine_facts(profile.engine)
    if facts is None:
        return names
    if profile.kv_events and facts.kv_events:
        names += [KV_PUB, KV_REPLAY]
    names += facts.leader_ports
    return names


def ports_per_shard(profile: Profile) -> int:
    """The most ports any shard of the profile binds: what a node must have free to take one."""
    return 1 + len(extra_port_names(profile, 0))


def free_ports(
    node: NodeRecord, taken: Collection[int], count: int, busy: Collection[int] = ()
) -> list[int] | None:
    """The lowest `count` ports in the node's range that no shard holds and no foreign process
    was found on; None when there are not that many."""
    found: list[int] = []
    for port in range(node.port_min, node.port_max + 1):
        if port not in taken and port not in busy:
            found.append(port)
            if len(found) == count:
                return found
    return None
