"""Engine installs: the EngineInstall child workflow's input."""

from __future__ import annotations

from pydantic import BaseModel

from workflows.contracts.nodes import EngineRequirement


class EngineInstallRequest(BaseModel):
    node: str
    requirement: EngineRequirement
