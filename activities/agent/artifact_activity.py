"""The node agent's activity that fetches an artifact from the control plane's mirror into
`<state_dir>/artifacts/` (artifact_store.py, artifact_fetch.py). Registered beside the agent's
other activities on its node's queue.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agent.artifact_fetch import (
    DigestMismatch,
    FetchFailed,
    FetchProgress,
    Mirror,
    fetch_artifact,
)
from activities.agent.artifact_store import ArtifactStore
from activities.agent.config import AgentConfig
from workflows.artifact_names import BadArtifact
from workflows.contracts import FetchArtifactRequest, FetchArtifactResult
from workflows.names import NodeActivity

# Far inside the workflow's heartbeat timeout (workflows/options.py FETCH_HEARTBEAT), and often
# enough that the progress in the UI moves.
HEARTBEAT_S = 3.0
# The first heartbeat reaches Temporal at once, the later ones only every so often (the agent's
# heartbeat throttle, workers/agent.py): it waits this long for the manifest, so that what the
# operator sees first is "0.00 of 8.59 GB" rather than "reading the manifest".
FIRST_HEARTBEAT_WAIT_S = 1.0


async def _until_sized(progress: FetchProgress, task: asyncio.Future[Any]) -> None:
    """Until the fetch knows its total (or ended), FIRST_HEARTBEAT_WAIT_S at most."""
    deadline = asyncio.get_running_loop().time() + FIRST_HEARTBEAT_WAIT_S
    while not progress.total and asyncio.get_running_loop().time() < deadline:
        done, _ = await asyncio.wait({task}, timeout=0.05)
        if done:
            return


class ArtifactActivities:
    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._store = ArtifactStore(config.artifacts_root)

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.fetch_artifact]

    @activity.defn(name=NodeActivity.FETCH_ARTIFACT)
    async def fetch_artifact(self, req: FetchArtifactRequest) -> FetchArtifactResult:
        """Fetch the artifact named by `req.manifest` from the mirror at `req.mirror`, verify
        every blob's sha256, and lay it out under `<state_dir>/artifacts/<manifest hex>/`.

        The heartbeat details say what is being fetched and how far it got: a line of text
        ("fetching (model.gguf): 1.20 of 4.00 GB (30%)"), which the Temporal UI shows first,
        then the same as numbers (FetchProgressReport), which `llmgw fetches` reads. Safe to
        retry: a retry resumes every partial blob from its size, and an artifact already
        complete returns at once with reused=True.

        The ArtifactFetch workflow (workflows/artifact_fetch.py) calls it with
        workflows/options.py's FETCH_* options: a heartbeat timeout (a killed agent is noticed,
        and the retry lands when it is back), hours per attempt, a day in all. Retryable:
        dropped connections, 5xx, a digest mismatch (its partial is removed, so the retry
        downloads again). Not retryable, by type: BadArtifact (not a manifest, another
        manifest's digest, unsafe paths), NoSpace ("needs N GB, M GB free on <dir>"),
        MirrorRefused (401: this node's token; 404: not in the mirror), MirrorFailed (no mirror
        configured, or one that answered a wrong range).
        """
        base_url = req.mirror or self._config.mirror
        if not base_url:
            raise ApplicationError(
                f"node {self._config.node} has no mirror to fetch {req.manifest} from: start "
                "its agent with --mirror URL",
                type="MirrorFailed",
                non_retryable=True,
            )
        progress = FetchProgress()
        stop = threading.Event()
        mirror = Mirror(base_url, self._config.node, self._config.node_secret)

        def work() -> FetchArtifactResult:
            outcome = fetch_artifact(self._store, mirror, req.manifest, progress, stop)
            return FetchArtifactResult(
                path=str(outcome.path), bytes_fetched=outcome.bytes_fetched, reused=outcome.reused
            )

        task = asyncio.ensure_future(asyncio.to_thread(work))
        # Cancelled, nobody awaits the thread's end: its FetchStopped is expected, not news.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await _until_sized(progress, task)
            while True:
                activity.heartbeat(progress.describe(), progress.report())
                done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_S)
                if done:
                    return task.result()
        except FetchFailed as e:
            raise ApplicationError(str(e), type=e.kind, non_retryable=True) from e
        except BadArtifact as e:  # the digest asked for is not one
            raise ApplicationError(str(e), type="BadArtifact", non_retryable=True) from e
        except DigestMismatch as e:
            raise ApplicationError(str(e), type="DigestMismatch") from e
        except httpx.HTTPError as e:
            raise ApplicationError(f"fetching {req.manifest}: {e}", type="MirrorUnreachable") from e
        finally:
            # Cancelled (the heartbeat timed out, the workflow went away): the thread stops at
            # its next chunk and leaves its partial for the retry.
            stop.set()
