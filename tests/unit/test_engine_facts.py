"""One row of facts per engine (workflows/contracts/engine_facts.py), and nothing else to touch.

Every engine llmgw knows has exactly one row and one adapter. A fake engine, added here as a
row and a stand-in adapter and nothing more, is accepted by the catalog, given its ports by
placement, billed, salted and given LoRA bodies by the gateway, and checked by the doctor, each
as its row says. A module that kept its own list of engine names would not know the fake one,
and a test below fails; one that kept its own copy of a fact would miss the row's change.
"""

from __future__ import annotations

import ast
import importlib
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities.agent.doctor.checks import diagnose
from activities.agent.doctor.facts import EngineCheck
from engines.adapter import Engine, InstallPlace, Progress, ShardLaunch
from engines.commands import Command
from engines.metrics import metrics_path
from engines.registry import ENGINES, adapter
from engines.verify import Verification
from gateway.billing import whole_response_counts
from gateway.cache_salt import isolates
from gateway.lora import serves_adapter
from gateway.quota import Reservation
from store import ApiKey, KeyLimits
from tests.machine_tools import by_check
from tests.unit.doctor_machines import facts_for, gpu, inventory
from workers.model_from_source import weights_inside
from workflows.catalog import check_profile
from workflows.contracts import (
    ENGINE_FACTS,
    ArtifactFile,
    ArtifactManifest,
    EngineFacts,
    EngineRequirement,
    EngineSource,
    EngineState,
    EngineStatus,
    LoraAdapter,
    MetricNames,
    Profile,
    ReplicaState,
    Route,
    engine_names,
)
from workflows.contracts.cuda_builds import CudaBuild
from workflows.engine_plan import EnginesConfig, installable_engines
from workflows.placement.ports import (
    ENGINE_INNER,
    KV_PUB,
    KV_REPLAY,
    RENDEZVOUS,
    extra_port_names,
    ports_per_shard,
)

FAKE = "fakeserve"
FAKE_ROW = EngineFacts(
    name=FAKE,
    title="FakeServe",
    multi_node=True,
    kv_events=True,
    lora=True,
    lora_by_index=True,
    counts_every_choice=True,
    cache_salt=True,
    leader_ports=(ENGINE_INNER,),
    install_sources=(EngineSource.PIP,),
    default_package="fakeserve",
    needs_nvidia=True,
    cuda_builds=(CudaBuild(since="0", cuda_major=12), CudaBuild(since="2", cuda_major=13)),
    metrics=MetricNames("fake_running", "fake_waiting", None, path="/fake/metrics"),
)


class FakeServe(Engine):
    """A stand-in adapter: the machinery only, as a real engine's module would hold it."""

    name = FAKE

    def install(
        self, req: EngineRequirement, where: InstallPlace, progress: Progress
    ) -> EngineStatus:
        return EngineStatus(engine=FAKE, version=req.version, state=EngineState.INSTALLED)

    def reverify(self, path: Path, version: str, where: InstallPlace) -> Verification:
        return Verification(True, "fake")

    def commands(self, shard: ShardLaunch) -> list[Command]:
        return [Command([str(shard.binary)])]

    def environment(self, shard: ShardLaunch) -> dict[str, str]:
        return {}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The fake engine's row and adapter, added where an engine's module and row would be."""
    monkeypatch.setitem(ENGINE_FACTS, FAKE, FAKE_ROW)
    monkeypatch.setitem(ENGINES, FAKE, FakeServe())
    return monkeypatch


def with_row(monkeypatch: pytest.MonkeyPatch, **changes: object) -> None:
    monkeypatch.setitem(ENGINE_FACTS, FAKE, replace(FAKE_ROW, **changes))  # type: ignore[arg-type]


# --- every engine: one row, one adapter, and they agree ---------------------------------------


def test_every_engine_has_exactly_one_row_and_one_adapter_of_its_name() -> None:
    assert list(ENGINE_FACTS) == list(ENGINES) == list(engine_names())
    for name, row in ENGINE_FACTS.items():
        assert row.name == name
        assert adapter(name).facts is row


def test_an_adapters_machinery_matches_what_its_row_says() -> None:
    for name, row in ENGINE_FACTS.items():
        engine = adapter(name)
        # Runtime LoRA needs the endpoints to load adapters with.
        assert (engine.runtime_adapters is not None) == row.lora_at_runtime, name
        # KV events need a publisher; an engine without them keeps the base class's None.
        publishes = type(engine).kv_publisher is not Engine.kv_publisher
        assert publishes == row.kv_events, name
        # Only engines that serve LoRA select one by index or load them while running.
        assert row.lora or not (row.lora_by_index or row.lora_at_runtime), name
        # Engines llmgw does not run have nothing to install.
        assert row.runs_on_nodes or not row.install_sources, name


def test_the_engines_config_section_has_a_field_for_each_engine_a_node_installs() -> None:
    assert tuple(EnginesConfig.model_fields) == installable_engines()


def test_the_facts_import_only_the_ground_floor() -> None:
    """The workflows read the table inside Temporal's sandbox, the gateway beside its event
    loop: pure data, from the standard library and workflows.contracts only."""
    module_file = importlib.import_module("workflows.contracts.engine_facts").__file__
    assert module_file is not None
    tree = ast.parse(Path(module_file).read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    plain = [node for node in ast.walk(tree) if isinstance(node, ast.Import)]
    imported += [alias.name for node in plain for alias in node.names]
    assert imported
    for module in imported:
        allowed = {"__future__", "collections", "dataclasses"}
        assert module.startswith("workflows.contracts.") or module.split(".")[0] in allowed, module


# --- a fake engine: its row and its adapter, nothing else ---------------------------------------


def fake_profile(**fields: object) -> Profile:
    base: dict[str, object] = {
        "engine": FAKE,
        "gpu_class": "h100-80g",
        "gpus_per_node": 2,
        "nodes": 2,
        "tensor_parallel": 4,
        "kv_events": True,
        "lora": [LoraAdapter(name="a", path="/lora/a")],
    }
    return Profile.model_validate({**base, **fields})


def test_the_catalog_accepts_the_fake_engine_as_its_row_says(fake: pytest.MonkeyPatch) -> None:
    assert check_profile(fake_profile()) == []
    assert check_profile(fake_profile(gpu_class=None, gpus_per_node=0, nodes=1, tensor_parallel=1))
    with_row(fake, multi_node=False, kv_events=False, lora=False)
    assert check_profile(fake_profile()) == [
        "nodes: fakeserve replicas run on one node",
        "kv_events: fakeserve does not publish KV-cache events",
        "lora: fakeserve adapters are not supported",
    ]


def test_the_catalog_does_not_know_an_engine_without_a_row() -> None:
    (problem,) = check_profile(fake_profile())
    assert problem.startswith("engine: 'fakeserve' is not one of")


def test_placement_gives_the_fake_engine_the_ports_of_its_row(fake: pytest.MonkeyPatch) -> None:
    profile = fake_profile()
    assert extra_port_names(profile, 0) == [RENDEZVOUS, KV_PUB, KV_REPLAY, ENGINE_INNER]
    assert extra_port_names(profile, 1) == []
    assert ports_per_shard(profile) == 5
    with_row(fake, kv_events=False, leader_ports=())
    assert extra_port_names(fake_profile(kv_events=True), 0) == [RENDEZVOUS]


def reserved(choices: int, per_choice: int) -> Reservation:
    reservation = Reservation("k", 0)
    reservation.choices, reservation.per_choice_tokens = choices, per_choice
    return reservation


def two_choices(completion: int) -> bytes:
    listed = [{"index": i, "message": {"content": "x"}} for i in range(2)]
    usage = {"prompt_tokens": 5, "completion_tokens": completion}
    return json.dumps({"choices": listed, "usage": usage}).encode()


def test_the_gateway_bills_the_fake_engine_as_its_row_says(fake: pytest.MonkeyPatch) -> None:
    # Its usage covers every choice: believed.
    assert whole_response_counts(two_choices(6), FAKE, reserved(2, 20), 50) == (5, 6)
    # One choice reported: the other billed at its bound, as for llama.cpp.
    with_row(fake, counts_every_choice=False)
    assert whole_response_counts(two_choices(6), FAKE, reserved(2, 20), 50) == (5, 26)


def fake_route(adapters: list[str] | None = None) -> Route:
    return Route(
        replica_id="fake-0",
        model="m",
        node="node-a",
        endpoint="http://127.0.0.1:1",
        engine=FAKE,
        state=ReplicaState.READY,
        adapters=adapters or [],
    )


def test_the_gateway_salts_and_selects_adapters_as_the_row_says(fake: pytest.MonkeyPatch) -> None:
    key = ApiKey(
        key_id="0a1b2c3d",
        name="k",
        key_hash="0" * 64,
        limits=KeyLimits(isolate_cache=True),
        created_at=datetime.now(UTC),
    )
    assert isolates(key, [fake_route()])
    # By index: a route listing no adapters serves none.
    assert not serves_adapter(fake_route(), "a")
    assert serves_adapter(fake_route(["a"]), "a")
    with_row(fake, cache_salt=False, lora_by_index=False)
    assert not isolates(key, [fake_route()])
    # By name: a route listing none leaves an unknown adapter to the engine to answer.
    assert serves_adapter(fake_route(), "a")


def test_the_doctor_checks_the_fake_engines_cuda_as_its_row_says(
    fake: pytest.MonkeyPatch,
) -> None:
    inv = inventory(nvidia_driver="550.54.15", cuda_version="12.4", gpus=[gpu(0)])
    facts = facts_for(inv, engines=[EngineCheck(engine=FAKE, version="2.1")])
    (cuda,) = by_check(diagnose(facts), "cuda-version")
    assert cuda.message.startswith("FakeServe 2.1 needs a driver for CUDA 13 or newer")
    assert "a FakeServe version before 2" in cuda.fix
    # Version 1's builds are CUDA 12 ones, which this driver runs.
    older = facts_for(inv, engines=[EngineCheck(engine=FAKE, version="1")])
    assert not by_check(diagnose(older), "cuda-version")
    with_row(fake, cuda_builds=(CudaBuild(since="0", cuda_major=12),))
    assert not by_check(diagnose(facts), "cuda-version")


@pytest.mark.usefixtures("fake")
def test_the_adapter_and_the_metrics_read_the_fake_engines_row() -> None:
    engine = adapter(FAKE)
    assert (engine.metrics, engine.kv_events, engine.runs_on_nodes) == (
        FAKE_ROW.metrics,
        True,
        True,
    )
    assert metrics_path(FAKE) == "/fake/metrics"


def test_slots_prompt_cache_and_priority_follow_the_fake_engines_row(
    fake: pytest.MonkeyPatch,
) -> None:
    args = ["--slots", "3", "--prompt-cache", "0", "--queue-order", "priority"]
    profile = fake_profile(args=args)
    # Its row names none of those flags: the gateway reads nothing from its command line.
    assert (profile.slots, profile.prompt_slots, profile.takes_priority) == (None, None, False)
    with_row(
        fake,
        slot_flags=("--slots",),
        prompt_cache_flags=("--prompt-cache",),
        priority_flag=("--queue-order", "priority"),
    )
    assert (profile.slots, profile.prompt_slots, profile.takes_priority) == (3, 3, True)
    # Without the flag, its slots come from the profile's `parallel`; a prompt cache left on
    # is no slot cache.
    assert fake_profile(args=[], parallel=5).slots == 5
    assert fake_profile(args=["--prompt-cache", "512"]).prompt_slots is None


def test_the_one_weights_file_of_an_artifact_is_the_kind_the_row_names(
    fake: pytest.MonkeyPatch,
) -> None:
    manifest = ArtifactManifest(
        files=[
            ArtifactFile(path="a.bin", size=1, digest="sha256:" + "0" * 64),
            ArtifactFile(path="w.fake", size=1, digest="sha256:" + "1" * 64),
        ]
    )
    assert weights_inside(manifest, None, FAKE) == ""  # the artifact's directory
    with_row(fake, weights_suffix=".fake")
    assert weights_inside(manifest, None, FAKE) == "w.fake"
