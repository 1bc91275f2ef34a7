"""Every workflow ID, task queue and activity name in one place.

IDs are deterministic so that "create if missing, then apply" calls are idempotent and an
operator can find any entity in the Temporal UI or CLI by its name.
"""

CONTROL_TASK_QUEUE = "llmgw-control"
LEDGER_WORKFLOW_ID = "cluster"


def node_task_queue(node: str) -> str:
    return f"node:{node}"


def node_workflow_id(node: str) -> str:
    return f"node:{node}"


def engine_install_workflow_id(node: str, engine: str, version: str) -> str:
    return f"engine:{node}:{engine}:{version}"


def model_workflow_id(model: str) -> str:
    return f"model:{model}"


def replica_workflow_id(model: str, index: int) -> str:
    return f"replica:{model}:{index}"


def replica_id(model: str, index: int) -> str:
    """The replica's own name: what the engine key is derived from and routes are keyed by."""
    return f"{model}-{index}"


class ControlActivity:
    """Activities the control worker runs (queue CONTROL_TASK_QUEUE)."""

    LEDGER_UPSERT_NODE = "ledger_upsert_node"
    LEDGER_PLACE = "ledger_place"
    LEDGER_RELEASE = "ledger_release"
    LEDGER_SET_ROUTE = "ledger_set_route"


class NodeActivity:
    """Activities each node agent runs on its own queue (node_task_queue(name))."""

    DISCOVER = "node_discover"
    INSTALL_ENGINE = "node_install_engine"
    START_ENGINE = "node_start_engine"
    WAIT_READY = "node_wait_ready"
    SUPERVISE_ENGINE = "node_supervise_engine"
    STOP_ENGINE = "node_stop_engine"
