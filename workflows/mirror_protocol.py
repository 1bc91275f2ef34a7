"""The mirror's HTTP surface as both ends name it: the control plane's server
(activities/control/mirror_server.py) and the node agents' fetch
(activities/agent/artifact_fetch.py). The token is engine_keys.mirror_token."""

from __future__ import annotations

MANIFESTS_PATH = "/mirror/v1/manifests"
BLOBS_PATH = "/mirror/v1/blobs"
# The node a request comes from: its token is checked against this node's secret.
NODE_HEADER = "X-Llmgw-Node"
