"""Which ports a shard binds, all handed out from its node's range (NodeRecord.port_min..max):
the engine's HTTP port, and on a leader the rendezvous point of a multi-node replica (vLLM's
--master-port, the Ray head, SGLang's --dist-init-addr), vLLM's KV-event publisher and replay
ports, and the loopback port a TensorRT-LLM leader's trtllm-serve listens on behind its key guard
(engines/trtllm.py: the guard holds the HTTP port). Ports an agent found held by a process
outside llmgw are skipped."""

from __future__ import annotations

from collections.abc import Collection

from workflows.contracts import NodeRecord, Profile

RENDEZVOUS = "rendezvous"
KV_PUB = "kv_pub"
KV_REPLAY = "kv_replay"
ENGINE_INNER = "engine_inner"


def extra_port_names(profile: Profile, rank: int) -> list[str]:
    """The ports a shard of this rank binds besides its HTTP port."""
    if rank != 0:
        return []  # workers connect to the leader's rendezvous point; they publish nothing
    names = [RENDEZVOUS] if profile.nodes > 1 else []
    if profile.kv_events and profile.engine == "vllm":
        names += [KV_PUB, KV_REPLAY]
    if profile.engine == "trtllm":
        names.append(ENGINE_INNER)  # trtllm-serve on loopback; its key guard has the HTTP port
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
