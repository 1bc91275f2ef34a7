"""Reading what a workflow did from its history, for tests that must know it never happened,
not merely that the end state looks right."""

import base64
import json
from typing import Any

from temporalio.client import Client

from workflows.names import ControlActivity, node_workflow_id


async def node_states_published(client: Client, node: str) -> list[str]:
    """Every node state the node's workflow wrote to the fleet tables, in order, over all its
    runs (the inputs of its ledger_upsert_node activities): a state it held only for a moment
    is here too."""
    events: list[dict[str, Any]] = []
    run_id: str | None = None
    while True:  # every run, oldest first, following continue-as-new back from the latest
        handle = client.get_workflow_handle(node_workflow_id(node), run_id=run_id)
        history = (await handle.fetch_history()).to_json_dict()
        events = history["events"] + events
        started = history["events"][0]["workflowExecutionStartedEventAttributes"]
        run_id = started.get("continuedExecutionRunId")
        if not run_id:
            break
    states = []
    for event in events:
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled is None:
            continue
        if scheduled["activityType"]["name"] != ControlActivity.LEDGER_UPSERT_NODE:
            continue
        for payload in scheduled["input"]["payloads"]:
            states.append(json.loads(base64.b64decode(payload["data"]))["state"])
    return states
