"""A node agent's fetch of one artifact from the control plane's mirror
(activities/agent/artifact_fetch.py; the artifact's files: workflows/contracts/artifacts.py)."""

from __future__ import annotations

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
