"""One node's fetch of one artifact (a model's weights, an adapter) from the control plane's
mirror: the node's `node_fetch_artifact` activity, bounded and retried as workflows/options.py
FETCH_* says, which resumes from what is on disk after an agent restart and checks every blob's
sha256.

Its ID (`fetch:<node>:<manifest hex>`, workflows/names.py) is what makes a fetch shared: the
replicas that need the artifact on that node do not start this workflow as a child (a child
start cannot join a running workflow: USE_EXISTING is refused for children), but through the
short control activity `control_join_artifact_fetch` (activities/control/artifact_fetches.py):
a signal-with-start of `wait`, which reaches the running fetch, or starts a new run when none
runs (that run finds the artifact on disk and ends at once). The waiter is a workflow ID and a
ticket: once the fetch is over it signals each waiter `artifact_fetched` with the outcome, and
a waiter that registers after that, in the same run, is told at once. So a replica waits in its
own workflow, and no activity slot is held while a download takes hours. (Replicas from before
waited inside the activity `control_await_artifact_fetch`, holding a control worker's slot.)

Progress: the activity heartbeats a line of text and a FetchProgressReport (bytes done of
total). A workflow cannot read its activities' heartbeats, and having the agent send progress
as signals would write history events for hours of progress; so the `describe` query answers
what the workflow knows (node, artifact, state, error) and `llmgw fetches` adds the bytes from
the pending activity's heartbeat (workers/fetch_progress.py), which the Temporal UI shows too.

A failed fetch fails this workflow (the Temporal UI shows it red, with the node's reason);
cancelled (`temporal workflow cancel`), it cancels the node's activity, which leaves its partial
download for the next fetch to resume.
"""

import asyncio

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
        FetchOutcome,
        FetchWaiter,
    )
    from workflows.messages import ARTIFACT_FETCHED
    from workflows.names import NodeActivity, node_task_queue

# Waiters are told in batches: a batch of signals costs one workflow task, and stays far under
# the 2,000 signals a run may have pending.
TELL_BATCH = 100


@workflow.defn(name="ArtifactFetch")
class ArtifactFetchWorkflow:
    @workflow.init
    def __init__(self, req: ArtifactFetchRequest) -> None:
        self.view = ArtifactFetchView(node=req.node, manifest=req.manifest, model=req.model)
        # Registered and not yet told, in order; a (workflow, ticket) registers once.
        self.waiters: list[FetchWaiter] = []
        self.registered: set[tuple[str, str]] = set()

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
            await self._tell_waiters()
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
        await self._tell_waiters()
        return self.view

    async def _tell_waiters(self) -> None:
        """Signal every waiter the outcome, those that register meanwhile included. A waiter
        whose signal lands as this run completes makes Temporal refuse the completion, and the
        new task runs its handler first: nobody registered in this run goes untold."""
        while True:
            await workflow.wait_condition(workflow.all_handlers_finished)
            if not self.waiters:
                return
            batch, self.waiters = self.waiters[:TELL_BATCH], self.waiters[TELL_BATCH:]
            await asyncio.gather(*(self._tell(waiter) for waiter in batch))

    async def _tell(self, waiter: FetchWaiter) -> None:
        outcome = FetchOutcome(ticket=waiter.ticket, view=self.view)
        handle = workflow.get_external_workflow_handle(waiter.workflow_id)
        try:
            await handle.signal(ARTIFACT_FETCHED, outcome)
        except ApplicationError as err:  # the waiter closed meanwhile: nobody left to tell
            workflow.logger.info("%s no longer waits: %s", waiter.workflow_id, err)

    @workflow.signal(name="wait")
    def wait(self, waiter: FetchWaiter) -> None:
        """A workflow waits on this fetch: told the outcome once it is known (at once if it
        is). A waiter that registers again (its periodic re-join) is not told twice."""
        key = (waiter.workflow_id, waiter.ticket)
        if key not in self.registered:
            self.registered.add(key)
            self.waiters.append(waiter)

    @workflow.query(name="describe")
    def describe(self) -> ArtifactFetchView:
        return self.view

    @workflow.query(name="waiting")
    def waiting(self) -> list[str]:
        """The workflows registered and not yet told (`llmgw fetches`, tests)."""
        return [waiter.workflow_id for waiter in self.waiters]
