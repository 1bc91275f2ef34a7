"""A node agent's fetch activity in a process of its own, for tests that kill it mid-fetch:
`python -m tests.integration.fetch_child STATE_DIR MIRROR_URL MANIFEST_DIGEST` prints the
activity's result as JSON. The node is the mirror kit's, with its secret."""

import asyncio
import sys
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.agent.artifact_activity import ArtifactActivities
from activities.agent.config import AgentConfig
from tests.unit.mirror_kit import NODE, NODE_SECRET
from workflows.contracts import FetchArtifactRequest


async def main(state_dir: Path, mirror: str, digest: str) -> None:
    config = AgentConfig(NODE, "127.0.0.1", state_dir, state_dir / "cache", NODE_SECRET)
    request = FetchArtifactRequest(manifest=digest, mirror=mirror)
    result = await ActivityEnvironment().run(ArtifactActivities(config).fetch_artifact, request)
    print(result.model_dump_json(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
