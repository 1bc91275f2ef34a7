"""The node agent's activity that fetches an artifact from the control plane's mirror into
`<state_dir>/artifacts/` (artifact_store.py, artifact_fetch.py). Registered beside the agent's
other activities on its node's queue.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

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

# Often enough that a heartbeat_timeout of 30 s notices a dead agent, and the UI moves.
HEARTBEAT_S = 3.0


def artifacts_root(state_dir: Path) -> Path:
    return state_dir / "artifacts"


class ArtifactActivities:
    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._store = ArtifactStore(artifacts_root(config.state_dir))

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.fetch_artifact]

    @activity.defn(name=NodeActivity.FETCH_ARTIFACT)
    async def fetch_artifact(self, req: FetchArtifactRequest) -> FetchArtifactResult:
        """Fetch the artifact named by `req.manifest` from the mirror at `req.mirror`, verify
        every blob's sha256, and lay it out under `<state_dir>/artifacts/<manifest hex>/`.

        The heartbeat details say what is being fetched and how far it got ("fetching
        (model.gguf): 1.20 of 4.00 GB (30%)"): that is what the Temporal UI shows. Safe to retry:
        a retry resumes every partial blob from its size, and an artifact already complete
        returns at once with reused=True.

        Intended options for the workflow that will call it (not written yet):
        heartbeat_timeout about 30 s, so a killed agent is noticed and the retry lands when it
        is back; start_to_close unset or generous; schedule_to_close sized to the artifact
        (hours for large weights) so a node that never returns fails the fetch. Retryable:
        dropped connections, 5xx, a digest mismatch (its partial is removed, so the retry
        downloads again). Not retryable: a refused token, a missing or invalid manifest, a
        manifest whose digest differs, too little disk ("needs N GB, M GB free on <dir>").
        """
        progress = FetchProgress()
        stop = threading.Event()
        mirror = Mirror(req.mirror, self._config.node, self._config.node_secret)

        def work() -> FetchArtifactResult:
            outcome = fetch_artifact(self._store, mirror, req.manifest, progress, stop)
            return FetchArtifactResult(
                path=str(outcome.path), bytes_fetched=outcome.bytes_fetched, reused=outcome.reused
            )

        task = asyncio.ensure_future(asyncio.to_thread(work))
        # Cancelled, nobody awaits the thread's end: its FetchStopped is expected, not news.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            while True:
                activity.heartbeat(progress.describe())
                done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_S)
                if done:
                    return task.result()
        except (FetchFailed, BadArtifact) as e:
            raise ApplicationError(str(e), type="FetchFailed", non_retryable=True) from e
        except DigestMismatch as e:
            raise ApplicationError(str(e), type="DigestMismatch") from e
        except httpx.HTTPError as e:
            raise ApplicationError(f"fetching {req.manifest}: {e}", type="MirrorUnreachable") from e
        finally:
            # Cancelled (the heartbeat timed out, the workflow went away): the thread stops at
            # its next chunk and leaves its partial for the retry.
            stop.set()
