"""One node's fetch of one artifact (a model's weights, an adapter) from the control plane's
mirror: the node's `node_fetch_artifact` activity, bounded and retried as workflows/options.py
FETCH_* says, which resumes from what is on disk after an agent restart and checks every blob's
sha256.

Its ID (`fetch:<node>:<manifest hex>`, workflows/names.py) is what makes a fetch shared: the
replicas that need the artifact on that node do not start this workflow as a child (a child
start cannot join a running workflow: USE_EXISTING is refused for children), but through the
control activity `control_await_artifact_fetch` (activities/control/artifact_fetches.py), which
starts it with the USE_EXISTING conflict policy and waits for its result. A second replica
joins the running fetch; once it has closed, the next start is a new run, which finds the
artifact on disk and ends at once.

Progress: the activity heartbeats a line of text and a FetchProgressReport (bytes done of
total). A workflow cannot read its activities' heartbeats, and having the agent send progress
as signals would write history events for hours of progress; so the `describe` query answers
what the workflow knows (node, artifact, state, error) and `llmgw fetches` adds the bytes from
the pending activity's heartbeat (workers/fetch_progress.py), which the Temporal UI shows too.

A failed fetch fails this workflow (the Temporal UI shows it red, with the node's reason);
cancelled (`temporal workflow cancel`), it cancels the node's activity, which leaves its partial
download for the next fetch to resume.
"""

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        ArtifactFetchRequest,
        ArtifactFetchState,
        ArtifactFetchView,
        FetchArtifactRequest,
        FetchArtifactResult,
    )
    from workflows.names import NodeActivity, node_task_queue


@workflow.defn(name="ArtifactFetch")
class ArtifactFetchWorkflow:
    @workflow.init
    def __init__(self, req: ArtifactFetchRequest) -> None:
        self.view = ArtifactFetchView(node=req.node, manifest=req.manifest, model=req.model)

    @workflow.run
    async def run(self, req: ArtifactFetchRequest) -> ArtifactFetchView:
        try:
            result: FetchArtifactResult = await workflow.execute_activity(
                NodeActivity.FETCH_ARTIFACT,
                FetchArtifactRequest(manifest=req.manifest, mirror=req.mirror),
                task_queue=node_task_queue(req.node),
                start_to_close_timeout=options.FETCH_TIMEOUT,
                schedule_to_close_timeout=options.FETCH_GIVE_UP,
                heartbeat_timeout=options.FETCH_HEARTBEAT,
                retry_policy=options.FETCH_RETRY,
                result_type=FetchArtifactResult,
            )
        except ActivityError as err:
            cause = err.cause or err
            self.view.state = ArtifactFetchState.FAILED
            self.view.error = str(cause)
            if isinstance(cause, ApplicationError):
                self.view.error, self.view.error_type = cause.message, cause.type or ""
            # Failed, not completed: the UI shows it as the failure it is. Not retryable: the
            # activity's own retries are spent (or its error is permanent); a replica that
            # tries again later starts a new run.
            raise ApplicationError(
                self.view.error,
                type=self.view.error_type or "FetchFailed",
                non_retryable=True,
            ) from err
        self.view.state = ArtifactFetchState.DONE
        self.view.path = result.path
        self.view.bytes_fetched = result.bytes_fetched
        self.view.reused = result.reused
        return self.view

    @workflow.query(name="describe")
    def describe(self) -> ArtifactFetchView:
        return self.view
