"""The "external" engine: an OpenAI-compatible server llmgw does not run (workflows/catalog.py).
Each of the model's URLs is a replica the gateway sends requests to; no node installs, places or
launches anything for it, and its metrics, if it has any, are not llmgw's to read. Its adapter
says so rather than leaving the engine out of the registry, so asking about it is never mistaken
for asking about an engine nobody knows.
"""

from __future__ import annotations

from pathlib import Path

from typing_extensions import override

from engines.adapter import (
    Engine,
    InstallPlace,
    NotRunByLlmgwError,
    Progress,
    ShardLaunch,
)
from engines.commands import Command
from engines.verify import Verification
from workflows.catalog import EXTERNAL
from workflows.contracts import EngineRequirement, EngineState, EngineStatus

NOT_RUN = f"engine {EXTERNAL} is served outside llmgw: nothing is installed or launched on a node"


class External(Engine):
    name = EXTERNAL

    @override
    def install(
        self, req: EngineRequirement, where: InstallPlace, progress: Progress
    ) -> EngineStatus:
        return EngineStatus(
            engine=EXTERNAL, version=req.version, state=EngineState.FAILED, detail=NOT_RUN
        )

    @override
    def reverify(self, path: Path, version: str, where: InstallPlace) -> Verification:
        return Verification(False, NOT_RUN)

    @override
    def commands(self, shard: ShardLaunch) -> list[Command]:
        raise NotRunByLlmgwError(NOT_RUN)

    @override
    def environment(self, shard: ShardLaunch) -> dict[str, str]:
        raise NotRunByLlmgwError(NOT_RUN)
