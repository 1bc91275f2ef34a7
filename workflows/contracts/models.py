"""Models: a model's declared spec, its profiles, and the model workflow's messages and state."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from pydantic import BaseModel, Field, model_validator

from workflows.contracts.engine_facts import EXTERNAL, LLAMACPP, engine_facts

# The most replicas one model may have.
MAX_REPLICAS = 10_000


class LoraAdapter(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    # The adapter on the nodes; with `artifact`, its path inside the artifact ("" for the
    # artifact's directory, as vLLM and SGLang take an adapter).
    path: str
    # The manifest digest of the adapter in the control plane's mirror: fetched with the
    # model's weights before the replica starts. "": none.
    artifact: str = ""


class KvEventSource(BaseModel):
    """One external vLLM's KV-cache event sockets, as the gateway reaches them. The engine's
    operator starts it with `--kv-events-config` naming a wildcard endpoint (tcp://*:PORT), on
    which its PUB socket binds; the gateway connects to it (gateway/kv/publishers.py). Checked
    in workflows/external_kv.py."""

    # "tcp://host:port": the engine's PUB socket.
    endpoint: str
    # "tcp://host:port": its replay socket (`replay_endpoint`); "": none, so a sequence gap
    # forgets what the engine holds instead of being filled.
    replay: str = ""
    # The config's `topic` ("" in vLLM by default).
    topic: str = ""


class ExternalKv(BaseModel):
    """Engine external only: the URLs are vLLM servers that publish KV-cache events, so the
    gateway routes by the blocks each one holds (docs/external-models.md)."""

    # One per URL, in the order of `urls`.
    sources: list[KvEventSource]
    # The engines' --block-size.
    block_size: int
    # The PYTHONHASHSEED the engines were started with; None: none (vLLM >= 0.29 then seeds its
    # hashes with "vllm-none-hash", older ones with random bytes nobody can reproduce).
    hash_seed: str | None = None


class Profile(BaseModel):
    """One way to run a model: engine, hardware and engine settings. A model lists one or more,
    most preferred first; placement takes the first that fits somewhere. Validated as a whole in
    workflows/catalog.py, which names the field at fault."""

    # llamacpp, vllm, sglang, trtllm; or external: an OpenAI-compatible server llmgw does not
    # run, one replica per URL in `urls`.
    engine: str = LLAMACPP
    engine_version: str = ""
    # None: the CPU. Otherwise a class as discovery names it: "h100-80g", "a100-80g-mig-3g.40gb".
    gpu_class: str | None = None
    gpus_per_node: int = Field(default=0, ge=0, le=16)
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    pipeline_parallel: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=64)
    cpu_cores: int = Field(default=2, ge=1)
    memory_mb: int = Field(default=1024, ge=64)
    context_size: int = Field(default=4096, ge=256)
    parallel: int = Field(default=2, ge=1, le=256)
    # "" or the weights' quantisation as the engine takes it ("fp8", "awq", ...).
    quantization: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    kv_events: bool = False
    lora: list[LoraAdapter] = Field(default_factory=list)
    # Multi-node launch: vLLM's own multi-process mode ("mp"), or a Ray cluster per replica.
    launch: str = Field(default="mp", pattern=r"^(mp|ray)$")
    # Engine "external" only: the servers' base URLs (http[s]://host[:port][/v1]). No key here:
    # a spec is in workflow history for anyone with the Temporal UI; the key lives in the
    # gateway's store (docs/external-models.md).
    urls: list[str] = Field(default_factory=list)
    # Engine "external" only: the name the servers know the model by (a hosted API's
    # "gpt-4o-mini"), sent upstream in place of llmgw's name; "" sends llmgw's name unchanged.
    upstream_model: str = ""
    # Engine "external" only: the servers' KV-cache events, one source per URL; None: the
    # gateway routes them by its own prefix index.
    external_kv: ExternalKv | None = None

    @property
    def gpus(self) -> int:
        """GPUs the replica uses in all."""
        return self.gpus_per_node * self.nodes

    @property
    def adapters_at_runtime(self) -> bool:
        """Its engine takes a new adapter list while it runs. Only with adapters: an engine
        started without any runs without LoRA (vLLM's --enable-lora), so the first adapter,
        or the removal of the last, needs a restart. Which engines can: their row's
        lora_at_runtime (workflows/contracts/engine_facts.py)."""
        facts = engine_facts(self.engine)
        return facts is not None and facts.lora_at_runtime and bool(self.lora)

    @property
    def prompt_slots(self) -> int | None:
        """An engine with slots started with its prompt cache at 0 (llama.cpp's `--cache-ram
        0`, in `args`): its slots, then its whole prompt cache (gateway/routing/slot_cache.py);
        None for any other profile. Flags from its row (prompt_cache_flags)."""
        facts = engine_facts(self.engine)
        if facts is None or not facts.prompt_cache_flags:
            return None
        if _last_flag_value(self.args, facts.prompt_cache_flags) != "0":
            return None
        return self.slots

    @property
    def slots(self) -> int | None:
        """How many requests its engine runs at once, where its command line says (llama.cpp's
        `-np`: the last one given, llmgw's own from `parallel` first); the rest wait in its
        queue. None for an engine whose row has no slot_flags: the gateway learns its
        concurrency from its gauges (gateway/admission/depths.py)."""
        facts = engine_facts(self.engine)
        if facts is None or not facts.slot_flags:
            return None
        slots = _last_flag_value(self.args, facts.slot_flags) or str(self.parallel)
        return int(slots) if slots.isdigit() and int(slots) > 0 else None

    @property
    def takes_priority(self) -> bool:
        """Its engine was started with its row's priority_flag (vLLM's `--scheduling-policy
        priority`, in `args`): it orders its queue by a request's `priority` (lower first) and
        preempts for it, and refuses a request that carries one otherwise. No other engine
        llmgw runs is sent one (llama.cpp has no such field; SGLang's and TensorRT-LLM's are
        not wired)."""
        facts = engine_facts(self.engine)
        if facts is None or facts.priority_flag is None:
            return False
        flag, value = facts.priority_flag
        return _last_flag_value(self.args, (flag,)) == value

    def fingerprint_fields(self, *, without_adapters: bool = False) -> dict[str, object]:
        """The profile as its fingerprint sees it. Fields added since fingerprints were first
        recorded count only when set, so a running replica's fingerprint, and with it the
        decision to roll it, does not change when llmgw is upgraded. `without_adapters`: the
        adapter list counts only as "some adapters" (ModelSpec.restart_fingerprint)."""
        data = self.model_dump()
        for added in ("urls", "upstream_model", "external_kv"):
            if not data[added]:
                del data[added]
        for adapter in data["lora"]:
            if not adapter["artifact"]:
                del adapter["artifact"]
        if without_adapters:
            data["lora"] = "loaded at runtime"
        return data


class Autoscale(BaseModel):
    """How a model's replica count follows its load, between min_replicas and max_replicas."""

    # Scale out when more than this many requests wait per replica, for `sustained_s`.
    queue_per_replica: float = Field(default=4.0, gt=0)
    sustained_s: float = Field(default=30.0, ge=0)
    # Scale in by one after this long with nothing waiting and spare replicas.
    quiet_s: float = Field(default=300.0, ge=0)
    # With min_replicas 0: no request for this long, and the model goes to zero replicas.
    idle_s: float = Field(default=900.0, ge=1)
    # How often the model looks at its engines' load.
    look_every_s: float = Field(default=15.0, ge=1, le=600)


# The flat fields a model had before profiles: still accepted, as its one profile.
_PROFILE_FIELDS = frozenset(Profile.model_fields)


class ModelSpec(BaseModel):
    """A model as declared by the operator: weights, profiles and how many replicas."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    # A GGUF file or model directory on the nodes; unused (and optional) for engine external.
    # With `artifact`: the file's path inside the artifact ("" for its whole directory).
    weights: str = ""
    # The manifest digest ("sha256:<hex>") of the weights in the control plane's mirror: each
    # node fetches it before the replica starts, so no node needs a path of its own. "": none.
    artifact: str = ""
    # The artifact's size in bytes, all its files (ArtifactManifest.size), set when the model
    # is defined from the mirror (`model add --from`): a node that must fetch the weights needs
    # this much free disk (workflows/placement/disk.py). 0: not known, and no node is refused
    # for space. Not in fingerprints: the digest already names every file's size.
    artifact_size: int = Field(default=0, ge=0)
    # For engine external: always the number of URLs, whatever was given (see below). Up to
    # MAX_REPLICAS: a fleet of 10,000 nodes (the model workflow starts them a bounded number
    # per run, workflows/options.py REPLICAS_STARTED_PER_RUN).
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    min_replicas: int = Field(default=0, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(default=64, ge=0, le=MAX_REPLICAS)
    autoscale: Autoscale | None = None
    profiles: list[Profile] = Field(default_factory=lambda: [Profile()], min_length=1, max_length=8)

    @model_validator(mode="before")
    @classmethod
    def _one_profile_from_flat_fields(cls, data: object) -> object:
        if isinstance(data, dict) and "profiles" not in data:
            flat = {k: data[k] for k in _PROFILE_FIELDS if k in data}
            rest = {k: v for k, v in data.items() if k not in _PROFILE_FIELDS}
            return {**rest, "profiles": [flat]}
        return data

    @model_validator(mode="after")
    def _external_replicas_are_its_urls(self) -> ModelSpec:
        if self.external:
            self.replicas = len(self.profiles[0].urls)
        return self

    @property
    def engine(self) -> str:
        return self.profiles[0].engine

    @property
    def external(self) -> bool:
        """Served by endpoints llmgw does not run: nothing is placed, each URL is a replica."""
        return self.engine == EXTERNAL

    def profile_fingerprint(self, index: int) -> str:
        """What a running replica on this profile was started from: when it differs from the
        catalog's, the replica is stale and a rolling update replaces it."""
        return self._fingerprint(index, without_adapters=False)

    def restart_fingerprint(self, index: int) -> str:
        """For a profile whose engine loads adapters at runtime (Profile.adapters_at_runtime):
        its fingerprint without the adapter list, which a running replica takes without a
        restart. A replica whose profile_fingerprint is stale but whose restart fingerprint is
        current is told the new list instead of being replaced. "" for any other profile."""
        if not self.profiles[index].adapters_at_runtime:
            return ""
        return self._fingerprint(index, without_adapters=True)

    def _fingerprint(self, index: int, *, without_adapters: bool) -> str:
        profile = self.profiles[index].fingerprint_fields(without_adapters=without_adapters)
        fields: dict[str, object] = {"weights": self.weights, "profile": profile}
        if self.artifact:  # counted only when set, as Profile.fingerprint_fields explains
            fields["artifact"] = self.artifact
        blob = json.dumps(
            fields,
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def fingerprints(self) -> list[str]:
        return [self.profile_fingerprint(i) for i in range(len(self.profiles))]

    def restart_fingerprints(self) -> list[str]:
        return [self.restart_fingerprint(i) for i in range(len(self.profiles))]

    def adapters_version(self) -> str:
        """Which definition a replica was told to load the adapters of: its fingerprints."""
        return ",".join(self.fingerprints())


class ScaleRequest(BaseModel):
    replicas: int = Field(ge=0, le=MAX_REPLICAS)


class RemoveModel(BaseModel):
    reason: str = "removed by operator"


class ModelView(BaseModel):
    spec: ModelSpec
    replica_ids: list[str] = Field(default_factory=list)
    removing: bool = False
    # Replicas kept serving until their successor is ready (a drain), by replica id.
    retiring: list[str] = Field(default_factory=list)
    # Replicas serving a profile the catalog no longer has: a rolling update replaces them.
    stale: list[str] = Field(default_factory=list)
    # Engine external: its routes, replica id -> endpoint (`llmgw ledger rebuild` reads them).
    external_routes: dict[str, str] = Field(default_factory=dict)


class ReplaceReplicas(BaseModel):
    """Move replicas off a node: start a successor for each; stop the old one once the successor
    is ready (a drain, nothing dropped) or at once (its node is lost or removed)."""

    replica_ids: list[str]
    reason: str
    wait_for_successor: bool = True


class ReplicaReady(BaseModel):
    """A replica tells its model it is serving (so a replica it replaces can stop) and from
    which profile (so the model knows whether it is current)."""

    replica_id: str
    fingerprint: str = ""
    # Its restart fingerprint (ModelSpec.restart_fingerprint): set when its engine takes
    # adapter changes while it runs. "" from replicas that cannot, and from those before it.
    restart_fingerprint: str = ""


class ModelWake(BaseModel):
    """A gateway holds a request for a model at zero replicas: start one."""

    reason: str = "a request arrived"


class AutoscaleState(BaseModel):
    """What the autoscaler remembers between looks, carried through continue-as-new."""

    queueing_since: datetime | None = None
    quiet_since: datetime | None = None
    last_active: datetime | None = None
    # The engines' token counters summed at the last look: a change means requests were served.
    last_work: float | None = None


class ModelState(BaseModel):
    """The model workflow's whole state, carried through continue-as-new."""

    spec: ModelSpec
    removing: bool = False
    next_index: int = 0
    indices: list[int] = Field(default_factory=list)
    # Old replica index -> the successor's index it waits for before it stops.
    retiring: dict[int, int] = Field(default_factory=dict)
    # Replica index -> the profile fingerprint it last reported serving with.
    fingerprints: dict[int, str] = Field(default_factory=dict)
    # Replica index -> the restart fingerprint it last reported (ReplicaReady).
    restart_fingerprints: dict[int, str] = Field(default_factory=dict)
    # Replica index -> the spec (ModelSpec.adapters_version) it was last told to load the
    # adapters of, so each change is told once.
    adapters_told: dict[int, str] = Field(default_factory=dict)
    # Set once this run tells replicas new adapters rather than replacing them (a patch:
    # workflows/model/workflow.py): stale_indices then leaves those replicas alone.
    adapters_at_runtime: bool = False
    autoscale: AutoscaleState = Field(default_factory=AutoscaleState)
    # Engine external: the routes this model published, replica id -> endpoint.
    external_routes: dict[str, str] = Field(default_factory=dict)
    # Pending work, carried so a continue-as-new never drops it:
    # moves asked for (drain, lost node, rolling update) not carried out yet;
    replacements: list[ReplaceReplicas] = Field(default_factory=list)
    # successors that said they serve, whose retiring predecessor may stop now;
    ready_replicas: list[str] = Field(default_factory=list)
    # replica indices told to stop whose workflow has not closed yet (removal waits for them);
    stopping: list[int] = Field(default_factory=list)
    # replica indices whose workflow closed unbidden and whose engine no stop has reached yet:
    # their allocation is kept until it stops or its node is gone;
    unstopped: list[int] = Field(default_factory=list)
    # whether the ledger was last told this model is idle (None: not told yet).
    published_idle: bool | None = None
    # When the autoscaler looks next and when the replica workflows are checked next: carried
    # so that a continue-as-new never puts them off (a run that continued before its look was
    # due would otherwise start the wait again, and could do so forever).
    look_at: datetime | None = None
    check_at: datetime | None = None
    # Set once a run has taken over the replicas an earlier run left (workflows/model/adoption.py):
    # a model applied again after its workflow was terminated adopts them instead of starting
    # second copies.
    adopted: bool = False


def _last_flag_value(args: list[str], names: tuple[str, ...]) -> str | None:
    """The last value `args` give a flag by any of its `names` (`-f v` or `-f=v`)."""
    found: str | None = None
    for index, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in names:
            found = inline if eq else (args[index + 1] if index + 1 < len(args) else "")
    return found
