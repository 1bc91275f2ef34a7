"""Loading the adapters an adopted engine was adopted for.

A replica whose adapter list changed while its engine ran (node_set_adapters) launches again
with the new list, after an agent restart say, and its engine is adopted rather than restarted
when nothing else of its profile changed (ShardSupervisor.launch records the new list as
pending). The list is loaded with the code node_set_adapters uses, which diffs against what
the engine serves: right away when the engine answers, else once it reports ready
(NodeAgentActivities.wait_ready). Then the spec records the adopted fingerprint and the
adapters its KV events are hashed with.
"""

from __future__ import annotations

from collections.abc import Callable

from activities.agent.adapter_loading import NoRuntimeAdapters, set_adapters
from activities.agent.supervisor import ShardSupervisor
from engines.registry import find


async def load_pending_adapters(
    supervisor: ShardSupervisor,
    replica_id: str,
    base_url: Callable[[int], str],
    key: str,
    timeout_s: float,
) -> bool:
    """Make the replica's engine (at `base_url` of its port) serve the adapters its spec holds
    as pending, and record them served; False when none are pending. Raises what
    adapter_loading.set_adapters raises (httpx.HTTPError while the engine does not answer: they
    stay pending), and NoRuntimeAdapters for an engine that loads adapters only at launch."""
    spec = supervisor.read_spec(replica_id)
    if spec is None or spec.pending_adapters is None:
        return False
    engine = find(spec.engine) if spec.engine else None
    runtime = engine.runtime_adapters if engine is not None else None
    if runtime is None:
        raise NoRuntimeAdapters(f"engine {spec.engine or 'unknown'} loads adapters only at launch")
    wanted = dict(spec.pending_adapters)
    await set_adapters(base_url(spec.port), key, runtime, wanted, timeout_s)
    supervisor.adapters_served(replica_id, spec.pid, wanted)
    return True
