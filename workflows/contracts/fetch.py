"""A node agent's fetch of one artifact from the control plane's mirror
(activities/agent/artifact_fetch.py; the artifact's files: workflows/contracts/artifacts.py)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class FetchArtifactRequest(BaseModel):
    # The artifact's manifest digest, "sha256:<hex>".
    manifest: str
    # The mirror's base URL; "": the one the agent was started with (--mirror).
    mirror: str = ""


class FetchArtifactResult(BaseModel):
    # The artifact's directory on the node, every file verified.
    path: str
    bytes_fetched: int = Field(default=0, ge=0)
    # True when the node held it already: nothing was fetched.
    reused: bool = False


class FetchProgressReport(BaseModel):
    """The node's fetch activity's heartbeat, after its line of text: what `llmgw fetches`
    shows. Heartbeats are kept on the pending activity, not in the history, so progress every
    few seconds for hours costs no history."""

    # Bytes of the artifact's blobs on disk and checked so far, of `total` (0: not known yet).
    done: int = Field(default=0, ge=0)
    total: int = Field(default=0, ge=0)
    # Bytes this attempt downloaded (the rest were there already, from an earlier attempt).
    fetched: int = Field(default=0, ge=0)
    # The file being fetched, and what the fetch is doing ("fetching", "checking what was
    # already downloaded", "laying out the artifact").
    current: str = ""
    note: str = ""


class ArtifactFetchRequest(BaseModel):
    """One node's fetch of one artifact: the ArtifactFetch workflow's input."""

    node: str = Field(min_length=1)
    # "sha256:<hex>", as FetchArtifactRequest.manifest.
    manifest: str
    mirror: str = ""
    # The model whose replica asked, for the operator's eyes only: a fetch two models share
    # names the one that started it.
    model: str = ""


class ArtifactFetchState(StrEnum):
    FETCHING = "fetching"
    DONE = "done"
    FAILED = "failed"


class ArtifactFetchView(BaseModel):
    """What an ArtifactFetch workflow says of itself (its `describe` query and its result).
    The bytes moving during a fetch are in its activity's heartbeat (FetchProgressReport)."""

    node: str
    manifest: str
    model: str = ""
    state: ArtifactFetchState = ArtifactFetchState.FETCHING
    # Why it failed, as the node said it.
    error: str = ""
    error_type: str = ""
    # Once done: the artifact's directory on the node, what this fetch downloaded, and whether
    # the node held it all already.
    path: str = ""
    bytes_fetched: int = Field(default=0, ge=0)
    reused: bool = False


class FetchWaiter(BaseModel):
    """A workflow waiting on a fetch (the ArtifactFetch workflow's `wait` signal): the fetch
    signals it `artifact_fetched` with the outcome, once, and at once if it is over."""

    workflow_id: str = Field(min_length=1)
    # Echoed in the outcome, so the waiter tells this wait's answer from a late one to an
    # earlier wait of its own.
    ticket: str = Field(min_length=1)


class JoinArtifactFetch(BaseModel):
    """The control activity `control_join_artifact_fetch`: start the node's fetch of the
    artifact, or join the one running, and register the waiter with it."""

    request: ArtifactFetchRequest
    waiter: FetchWaiter


class FetchOutcome(BaseModel):
    """A fetch's end, signalled to each waiter (`artifact_fetched`)."""

    ticket: str
    view: ArtifactFetchView
