"""Every workflow ID, task queue and activity name in one place.

IDs are deterministic so that "create if missing, then apply" calls are idempotent and an
operator can find any entity in the Temporal UI or CLI by its name.
"""

# Every workflow runs here. Workflows send their control activities and child workflows to their
# own task queue (this one, in llmgw) rather than naming it, so a control worker on another
# queue (a test's own) serves a whole cluster of workflows by itself.
CONTROL_TASK_QUEUE = "llmgw-control"


def node_task_queue(node: str) -> str:
    return f"node:{node}"


def node_workflow_id(node: str) -> str:
    return f"node:{node}"


def engine_install_workflow_id(node: str, engine: str, version: str) -> str:
    return f"engine:{node}:{engine}:{version}"


def artifact_fetch_workflow_id(node: str, manifest: str) -> str:
    """One node's fetch of one artifact (`manifest`: "sha256:<hex>"). The whole digest, not a
    prefix: two replicas that want the same artifact on the same node share the fetch by this
    ID, so two artifacts must never share it."""
    return f"fetch:{node}:{manifest.removeprefix('sha256:')}"


def model_workflow_id(model: str) -> str:
    return f"model:{model}"


def replica_workflow_id(model: str, index: int) -> str:
    return f"replica:{model}:{index}"


def replica_id(model: str, index: int) -> str:
    """The replica's own name: what the engine key is derived from and routes are keyed by."""
    return f"{model}-{index}"


# The node an external model's routes name: they run on no node of ours.
EXTERNAL_NODE = "external"
# Names no node may take. A node called "external" would share its routes' node name with every
# external model's: losing it would take those routes out of service, and `llmgw nodes` and the
# routing table could not tell them apart.
RESERVED_NODE_NAMES = frozenset({EXTERNAL_NODE})


def reserved_node_name(name: str) -> str | None:
    """Why `name` cannot name a node, or None when it can."""
    if name.lower() in RESERVED_NODE_NAMES:
        return f"the node name {name!r} is reserved for external models' routes; pick another"
    return None


def external_replica_id(model: str, index: int) -> str:
    """One URL of an external model. The slash, which no model name holds, keeps these apart
    from replica_id()'s names."""
    return f"{model}/ext-{index}"


class ControlActivity:
    """Activities the control worker runs (on the workflow's own queue: CONTROL_TASK_QUEUE)."""

    LEDGER_UPSERT_NODE = "ledger_upsert_node"
    LEDGER_PLACE = "ledger_place"
    LEDGER_RELEASE = "ledger_release"
    LEDGER_SET_ROUTE = "ledger_set_route"
    LEDGER_REPLICAS_ON_NODE = "ledger_replicas_on_node"
    LEDGER_NODE_NAMES = "ledger_node_names"
    LEDGER_MODEL_ROUTES = "ledger_model_routes"
    LEDGER_SET_IDLE = "ledger_set_idle"
    # A node's state as the ledger has it (a replica whose stop was not delivered asks whether
    # the node is gone before it frees the allocation).
    LEDGER_NODE_STATE = "ledger_node_state"
    # What the ledger holds for one replica (a model frees a dead replica's).
    LEDGER_ALLOCATION = "ledger_allocation"
    # Whether workflows, by ID, have an open run (a model watches its replicas by ID).
    DESCRIBE_WORKFLOWS = "control_describe_workflows"
    # One look at a model's load: every hosting node's agent metrics read at once, summed.
    MODEL_LOAD = "control_model_load"
    # Which engines a node should have, from the cluster's `engines:` configuration.
    ENGINE_PLAN = "control_engine_plan"
    # The nodes an operator listed in a file, for scheduled onboarding.
    READ_NODES_FILE = "control_read_nodes_file"
    # Expect a node: create its workflow if missing, set its labels and identity.
    ADD_NODE = "control_add_node"
    # Start a node's fetch of an artifact (the ArtifactFetch workflow), or join the one already
    # running, and register a waiter it signals when it ends: how a replica shares a fetch with
    # others on its node without holding an activity slot while it waits.
    JOIN_ARTIFACT_FETCH = "control_join_artifact_fetch"
    # What replicas did before: join and wait for the end inside the activity. Kept for the
    # waits their runs still have in flight.
    AWAIT_ARTIFACT_FETCH = "control_await_artifact_fetch"


class NodeActivity:
    """Activities each node agent runs on its own queue (node_task_queue(name))."""

    DISCOVER = "node_discover"
    INSTALL_ENGINE = "node_install_engine"
    START_ENGINE = "node_start_engine"
    WAIT_READY = "node_wait_ready"
    SUPERVISE_ENGINE = "node_supervise_engine"
    STOP_ENGINE = "node_stop_engine"
    VERIFY_ENGINES = "node_verify_engines"
    ENGINE_LOAD = "node_engine_load"
    FETCH_ARTIFACT = "node_fetch_artifact"
    # Load and unload a running engine's LoRA adapters (engines that can: Engine.runtime_adapters).
    SET_ADAPTERS = "node_set_adapters"
    # Held by the agent for as long as it lives (bounded): the node's liveness, heartbeated to
    # Temporal without a history event per beat (workflows/node/watch.py).
    WATCH_LIVENESS = "node_watch_liveness"


# Temporal Schedules: each starts a short fleet-wide workflow that signals every node.
ENGINE_REVERIFY_SCHEDULE_ID = "llmgw-engine-reverify"
INVENTORY_REFRESH_SCHEDULE_ID = "llmgw-inventory-refresh"
SCHEDULED_ONBOARDING_SCHEDULE_ID = "llmgw-scheduled-onboarding"
# The workflow IDs each schedule's runs get (Temporal appends the scheduled time).
ENGINE_REVERIFY_WORKFLOW_ID = "fleet-reverify"
INVENTORY_REFRESH_WORKFLOW_ID = "fleet-inventory"
SCHEDULED_ONBOARDING_WORKFLOW_ID = "fleet-onboarding"
