"""The model workflow's pure decisions: which replicas it watches, which are stale and which
take a new adapter list without a restart, whether a scale request fits the model, its view,
and the routes of an external model's URLs (with their KV-event sources,
Profile.external_kv).

Pure: the model workflow (workflows/model/workflow.py) runs them inside the sandbox, and replays
them;
`llmgw ledger rebuild` rebuilds an external model's routes with external_route.
"""

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.catalog import EXTERNAL, endpoint_base
    from workflows.contracts import (
        KvSource,
        ModelSpec,
        ModelState,
        ModelView,
        Profile,
        RemoveModel,
        ReplicaState,
        Route,
    )
    from workflows.names import EXTERNAL_NODE, replica_id


def external_route(spec: ModelSpec, rid: str, endpoint: str, state: ReplicaState) -> Route:
    """The route of one URL of an external model (the model publishes it; `llmgw ledger
    rebuild` rebuilds it)."""
    return Route(
        replica_id=rid,
        model=spec.name,
        node=EXTERNAL_NODE,
        endpoint=endpoint,
        engine=EXTERNAL,
        state=state,
        fingerprint=spec.profile_fingerprint(0) if spec.external else "",
        detail="external endpoint",
        upstream_model=spec.profiles[0].upstream_model,
        kv=external_kv_source(spec.profiles[0], endpoint) if spec.external else None,
    )


def external_kv_source(profile: Profile, endpoint: str) -> KvSource | None:
    """Where a gateway hears the KV-cache events of the external engine at `endpoint` (a URL's
    endpoint_base): the source given in the URL's place (Profile.external_kv), or None."""
    kv = profile.external_kv
    if kv is None:
        return None
    for url, source in zip(profile.urls, kv.sources, strict=False):
        if endpoint_base(url) == endpoint:
            return KvSource(
                block_size=kv.block_size,
                hash_seed=kv.hash_seed,
                publisher=source.endpoint,
                replay=source.replay,
                topic=source.topic,
            )
    return None


# A removal's reason is for the operator's eyes: a line, not a document.
MAX_REMOVAL_REASON = 500


def check_removal(req: RemoveModel) -> None:
    """Raise ApplicationError (type InvalidRequest) unless `req` may be recorded: an update
    refused here is never written to the model's history."""
    if len(req.reason) > MAX_REMOVAL_REASON or "\n" in req.reason:
        raise ApplicationError(
            f"a removal's reason is one line of at most {MAX_REMOVAL_REASON} characters",
            type="InvalidRequest",
        )


def check_scale(spec: ModelSpec, replicas: int) -> None:
    """Raise ApplicationError (type InvalidModel) unless `spec` may run `replicas` replicas."""
    if spec.external:
        raise ApplicationError(
            f"model {spec.name}: an external model has one replica per URL; change its "
            "URLs instead",
            type="InvalidModel",
        )
    if not spec.min_replicas <= replicas <= spec.max_replicas:
        raise ApplicationError(
            f"model {spec.name}: {replicas} replicas is outside min_replicas.."
            f"max_replicas ({spec.min_replicas}..{spec.max_replicas})",
            type="InvalidModel",
        )


def stale_indices(state: ModelState) -> list[int]:
    """Replicas serving a profile the catalog no longer has: a rolling update replaces them.
    Once the model tells replicas new adapters (ModelState.adapters_at_runtime), those that
    take them at runtime (adapter_updates) are not stale."""
    current = set(state.spec.fingerprints())
    known = state.fingerprints
    updating = set(adapter_updates(state)) if state.adapters_at_runtime else set()
    return [
        i for i in state.indices if i in known and known[i] not in current and i not in updating
    ]


def adapter_updates(state: ModelState) -> list[int]:
    """Replicas whose profile changed only in its LoRA adapters, on an engine that loads them
    at runtime: their fingerprint is stale, the restart fingerprint they reported is current
    (ModelSpec.restart_fingerprint). A replica that could not load them reports none, and is
    replaced like any stale one."""
    current = set(state.spec.fingerprints())
    restartless = set(state.spec.restart_fingerprints()) - {""}
    known, restart = state.fingerprints, state.restart_fingerprints
    return [
        i
        for i in state.indices
        if i in known and known[i] not in current and restart.get(i, "") in restartless
    ]


def adapters_to_tell(state: ModelState) -> list[int]:
    """The adapter_updates not yet told about this definition."""
    version = state.spec.adapters_version()
    return [i for i in adapter_updates(state) if state.adapters_told.get(i) != version]


def index_of(state: ModelState, rid: str) -> int | None:
    """The index of replica id `rid` among the replicas in the model's count, or None."""
    name = state.spec.name
    return next((i for i in state.indices if replica_id(name, i) == rid), None)


def watched_indices(state: ModelState) -> list[int]:
    """Every replica whose workflow should be running: serving or starting, retiring, or
    told to stop and not yet closed."""
    return sorted(set(state.indices) | set(state.retiring) | set(state.stopping))


def model_view(state: ModelState) -> ModelView:
    name = state.spec.name
    return ModelView(
        spec=state.spec,
        replica_ids=[replica_id(name, i) for i in state.indices] + list(state.external_routes),
        removing=state.removing,
        retiring=[replica_id(name, i) for i in state.retiring],
        stale=[replica_id(name, i) for i in stale_indices(state)],
        external_routes=state.external_routes,
    )
