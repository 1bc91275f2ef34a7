"""This machine as the scheduler sees it: what the agent registers and publishes, and what
`llmgw agent inventory` prints on the node without joining."""

from __future__ import annotations

from pathlib import Path

from activities.agent.artifact_store import ArtifactStore
from activities.agent.discovery import discover_inventory
from engines.engine_dir import version_dirs
from workflows.contracts import EngineState, EngineStatus, NodeInventory


def machine_inventory(
    node: str, address: str, artifacts_root: Path, metrics_url: str = ""
) -> NodeInventory:
    """Discovery's view of the machine, with the artifacts it holds and room for more."""
    inventory = discover_inventory(node, address)
    store = ArtifactStore(artifacts_root)
    held = {
        "artifacts": store.complete(),
        "artifact_disk_free_mb": store.disk_free_mb(),
        "metrics_url": metrics_url,
    }
    return inventory.model_copy(update=held)


def installed_engines(engines_root: Path, engine_paths: dict[str, str]) -> list[EngineStatus]:
    """The engines installed under the state dir (by their install markers, not run again:
    `llmgw doctor` runs them) and those an operator names by path."""
    found: list[EngineStatus] = []
    for _engine, version_dir, marker in version_dirs(engines_root):
        if marker is None:
            continue  # an install that did not finish
        found.append(
            EngineStatus(
                engine=marker.engine,
                version=marker.version,
                state=EngineState.INSTALLED,
                path=str(version_dir / marker.binary),
                detail=marker.detail,
            )
        )
    for engine, path in sorted(engine_paths.items()):
        found.append(
            EngineStatus(
                engine=engine, version="operator-provided", state=EngineState.INSTALLED, path=path
            )
        )
    return found
