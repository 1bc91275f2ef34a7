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

from collections.abc import Awaitable, Callable

import httpx
from temporalio.exceptions import ApplicationError

from activities.agent.adapter_loading import REQUEST_TIMEOUT_S as ADAPTER_REQUEST_TIMEOUT_S
from activities.agent.adapter_loading import (
    AdapterRefused,
    ModelListUnavailable,
    NoRuntimeAdapters,
    set_adapters,
)
from activities.agent.supervisor import ShardSupervisor
from engines.registry import find
from workflows.contracts import ReadyResult

# How long an adopted engine's adapters may take to load during START_ENGINE (its activity has
# two minutes); one that does not answer by then loads them once ready (wait_ready).
ADOPT_LOAD_TIMEOUT_S = 30.0


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


async def refusal_on_adoption(
    supervisor: ShardSupervisor, replica_id: str, base_url: Callable[[int], str], key: str
) -> Exception | None:
    """Right after an adoption: load the pending list when the engine answers (one still
    loading is left pending, for wait_ready). The engine's refusal, when it will not take the
    list (the caller replaces it: a start loads the adapters from its command line); else None."""
    try:
        await load_pending_adapters(supervisor, replica_id, base_url, key, ADOPT_LOAD_TIMEOUT_S)
    except (httpx.HTTPError, ModelListUnavailable):
        return None  # not answering yet: left pending
    except (AdapterRefused, NoRuntimeAdapters) as err:
        return err
    return None


async def ready_with_adapters(
    supervisor: ShardSupervisor,
    replica_id: str,
    base_url: Callable[[int], str],
    key: str,
    ready: ReadyResult,
    heartbeating: Callable[[Awaitable[bool]], Awaitable[bool]],
) -> ReadyResult:
    """A ready engine adopted for another adapter list serves it before it counts as ready;
    one that refuses it is not ready (the replica then starts a new engine). `heartbeating`
    awaits the loading while the activity heartbeats."""
    load = load_pending_adapters(supervisor, replica_id, base_url, key, ADAPTER_REQUEST_TIMEOUT_S)
    try:
        loaded = await heartbeating(load)
    except (AdapterRefused, NoRuntimeAdapters) as err:
        return ReadyResult(ready=False, detail=f"adapters not loaded: {err}")
    except httpx.HTTPError as err:
        # Retried: the engine answered a moment ago (a retry asks it again).
        raise ApplicationError(
            f"{replica_id}: its engine did not answer ({type(err).__name__})",
            type="EngineUnreachable",
        ) from None
    if not loaded:
        return ready
    return ready.model_copy(update={"detail": f"{ready.detail}; adopted adapters loaded"})
