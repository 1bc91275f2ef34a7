"""The nodes' running fetches of models' artifacts, for `llmgw fetches` and `llmgw status`.

Each fetch is an ArtifactFetch workflow (workflows/artifact_fetch.py). What it is (node,
artifact, model, state) comes from its `describe` query; how far it got comes from its node
activity's latest heartbeat (a line of text, then a FetchProgressReport), read from the
workflow's pending activity as the Temporal UI reads it: the workflow itself never sees its
activity's heartbeats.
"""

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from workers.tables import table
from workflows.artifact_fetch import ArtifactFetchWorkflow
from workflows.contracts import ArtifactFetchView, FetchProgressReport

RUNNING_FETCHES = "WorkflowType = 'ArtifactFetch' AND ExecutionStatus = 'Running'"
GB = 1e9
# Enough of a digest to tell artifacts apart on a screen; the workflow ID has it whole.
SHORT_DIGEST = 12


@dataclass
class FetchStatus:
    workflow_id: str
    view: ArtifactFetchView
    # The latest heartbeat: its numbers (None from an agent that sends only the line) and line.
    report: FetchProgressReport | None = None
    line: str = ""
    # The node activity's attempt, and why the one before failed (a killed agent, a dropped
    # connection): a fetch being retried says so.
    attempt: int = 1
    last_failure: str = ""


async def fetch_status(client: Client, workflow_id: str) -> FetchStatus | None:
    """One fetch's state and progress; None when it cannot be asked (gone, or no control
    worker to answer the query)."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        described = await handle.describe()
        view = await handle.query(ArtifactFetchWorkflow.describe)
    except (RPCError, WorkflowQueryFailedError):
        return None
    status = FetchStatus(workflow_id=workflow_id, view=view)
    for pending in described.raw_description.pending_activities:
        status.attempt = pending.attempt
        if pending.HasField("last_failure"):
            status.last_failure = pending.last_failure.message
        if pending.heartbeat_details.payloads:
            values = await client.data_converter.decode(pending.heartbeat_details.payloads)
            status.line, status.report = read_heartbeat(values)
    return status


def read_heartbeat(values: list[Any]) -> tuple[str, FetchProgressReport | None]:
    """The fetch activity's heartbeat details: its line of text and, from an agent that sends
    them, its numbers."""
    line, report = "", None
    for value in values:
        if isinstance(value, str):
            line = value
        elif isinstance(value, dict):
            try:
                report = FetchProgressReport.model_validate(value)
            except ValidationError:
                continue
    return line, report


async def running_fetches(client: Client) -> list[FetchStatus]:
    statuses = []
    async for execution in client.list_workflows(RUNNING_FETCHES):
        status = await fetch_status(client, execution.id)
        if status is not None:
            statuses.append(status)
    return sorted(statuses, key=lambda s: (s.view.node, s.view.manifest))


def progress_text(report: FetchProgressReport | None) -> str:
    """ "3.22 of 8.59 GB (38%)"; "" before the node has read the manifest."""
    if report is None or not report.total:
        return ""
    share = 100 * report.done / report.total
    return f"{report.done / GB:.2f} of {report.total / GB:.2f} GB ({share:.0f}%)"


def short_digest(manifest: str) -> str:
    hex_digits = manifest.removeprefix("sha256:")
    return f"sha256:{hex_digits[:SHORT_DIGEST]}" if len(hex_digits) > SHORT_DIGEST else manifest


def fetch_row(status: FetchStatus) -> list[str]:
    report = status.report
    if report is not None:
        doing = f"{report.note} ({report.current})" if report.current else report.note
    else:
        doing = status.line
    if status.attempt > 1:
        retried = f"attempt {status.attempt}"
        if status.last_failure:
            retried += f", the last failed: {status.last_failure}"
        doing = f"{doing}; {retried}" if doing else retried
    if status.view.error:
        doing = status.view.error
    return [
        status.view.node,
        short_digest(status.view.manifest),
        status.view.model,
        status.view.state.value,
        progress_text(report),
        doing,
    ]


def fetches_table(statuses: list[FetchStatus]) -> str:
    headers = ["NODE", "ARTIFACT", "MODEL", "STATE", "PROGRESS", "DETAIL"]
    return table(headers, [fetch_row(s) for s in statuses])


async def show_fetches(client: Client) -> None:
    statuses = await running_fetches(client)
    if not statuses:
        print("no fetch running")
        return
    print(fetches_table(statuses))
