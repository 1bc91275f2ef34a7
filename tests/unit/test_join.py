"""Join tokens and what `llmgw nodes` says about a node that takes no replicas."""

import stat
from pathlib import Path
from typing import Any

import pytest

from workers.commands.node import gpu_summary, parse_labels, why_not_placeable
from workers.join import JoinToken, accept_join_token
from workers.paths import Locations
from workflows.contracts import (
    EngineState,
    EngineStatus,
    GpuInfo,
    NodeInventory,
    NodeRecord,
    NodeState,
)
from workflows.engine_keys import node_secret
from workflows.node.proof import identity_key


def test_a_token_round_trips_and_its_secret_is_the_nodes_own() -> None:
    secret = node_secret(b"m" * 32, "gpu-7")
    token = JoinToken(node="gpu-7", temporal="10.0.0.1:7233", secret=secret)
    decoded = JoinToken.decode(token.encode())
    assert decoded == token
    assert identity_key(decoded.secret) == identity_key(node_secret(b"m" * 32, "gpu-7"))
    assert identity_key(decoded.secret) != identity_key(node_secret(b"m" * 32, "gpu-8"))


@pytest.mark.parametrize(
    "bad",
    ["", "hello", "llmgw-join-", "llmgw-join-!!!", "llmgw-join-eyJub2RlIjogMX0"],
)
def test_a_damaged_token_is_refused_with_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="join token"):
        JoinToken.decode(bad)


def test_accepting_a_token_keeps_the_secret_readable_by_its_owner_only(tmp_path: Path) -> None:
    where = Locations.resolve(str(tmp_path))
    token = JoinToken(node="n9", temporal="t:1", secret=b"\x01" * 32)
    accept_join_token(where, token)
    path = where.node_secret_file("n9")
    assert path.read_text().strip() == token.secret.hex()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_labels_must_be_key_value() -> None:
    assert parse_labels(["rack=r1", "empty="]) == {"rack": "r1", "empty": ""}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        parse_labels(["rack"])


def record(**fields: Any) -> NodeRecord:
    gpus = [
        GpuInfo(index=0, uuid="GPU-0", name="NVIDIA H100", gpu_class="h100-80g", memory_mb=81559),
        GpuInfo(index=1, uuid="GPU-1", name="NVIDIA H100", gpu_class="h100-80g", memory_mb=81559),
        GpuInfo(
            index=2,
            uuid="GPU-2",
            name="NVIDIA H100",
            gpu_class="h100-80g",
            memory_mb=81559,
            unusable="3 uncorrected ECC errors",
        ),
    ]
    installed = EngineStatus(engine="llamacpp", version="1", state=EngineState.INSTALLED)
    base: dict[str, Any] = {
        "inventory": NodeInventory(name="n1", gpus=gpus),
        "state": NodeState.READY,
        "engines": {"llamacpp": installed},
    }
    return NodeRecord(**{**base, **fields})


def test_a_healthy_node_is_placeable_and_its_gpus_are_counted_by_class() -> None:
    healthy = record()
    healthy.inventory.gpus.pop()
    assert why_not_placeable(healthy) == []
    assert gpu_summary(healthy) == "2x h100-80g"


def test_every_reason_a_node_takes_no_replicas_is_listed() -> None:
    failed = EngineStatus(engine="llamacpp", version="1", state=EngineState.FAILED)
    node = record(cordoned=True, draining=True, note="kernel update", engines={"llamacpp": failed})
    assert why_not_placeable(node) == [
        "draining: kernel update",
        "no engine can run here (llamacpp failed)",
        "GPU 2 (h100-80g): 3 uncorrected ECC errors",
    ]
    assert gpu_summary(node) == "2x h100-80g (+1 unusable)"
    lost = record(state=NodeState.LOST, note="no heartbeat for 47s")
    assert why_not_placeable(lost)[0] == "lost: no heartbeat for 47s"
