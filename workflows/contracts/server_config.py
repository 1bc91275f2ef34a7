"""Server configuration: the nodes file and scheduled onboarding."""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.contracts.nodes import NodeAdd


class NodesFileRequest(BaseModel):
    """Read the nodes file the server configuration names (`nodes_file:`)."""


class NodesFile(BaseModel):
    """The nodes an operator listed for scheduled onboarding; `source` is the file read (empty
    when the configuration names none)."""

    source: str = ""
    nodes: list[NodeAdd] = Field(default_factory=list)


class OnboardingProgress(BaseModel):
    """Scheduled onboarding carried through continue-as-new: the listed nodes still to add,
    and those added so far."""

    nodes: list[NodeAdd] = Field(default_factory=list)
    added: list[str] = Field(default_factory=list)
