"""Which adapter changes a running replica takes without a restart: the restart fingerprint
(ModelSpec.restart_fingerprint), the model's choice between telling and replacing
(model_rules), and the replica's own check (replica_rules)."""

from typing import Any

from workflows.contracts import LoraAdapter, ModelSpec, ModelState, Profile
from workflows.model.rules import adapter_updates, adapters_to_tell, stale_indices
from workflows.replica.rules import new_adapter_artifacts, takes_adapters_at_runtime

SQL = LoraAdapter(name="sql", path="/a/sql")
POEM = LoraAdapter(name="poem", path="", artifact="sha256:" + "cd" * 32)


def spec(engine: str = "vllm", lora: list[LoraAdapter] | None = None, **profile: Any) -> ModelSpec:
    version = "0.32.0" if engine == "vllm" else "1"
    return ModelSpec(
        name="m",
        weights="/w",
        profiles=[Profile(engine=engine, engine_version=version, lora=lora or [], **profile)],
    )


def test_fingerprints_recorded_before_are_unchanged() -> None:
    """Running replicas reported these; a new formula would roll every one at the upgrade (and
    break the replay of histories that compared them)."""
    model = ModelSpec(
        name="m",
        weights="/w",
        profiles=[
            Profile(engine="vllm", engine_version="0.32.0", lora=[SQL]),
            Profile(engine="llamacpp", lora=[LoraAdapter(name="sql", path="/a/sql.gguf")]),
        ],
    )
    assert model.fingerprints() == ["0e0c6e60734d218f", "db1584d1443312cd"]


def test_a_vllm_restart_fingerprint_ignores_which_adapters_but_not_whether_any() -> None:
    one, two = spec(lora=[SQL]), spec(lora=[SQL, POEM])
    assert one.profile_fingerprint(0) != two.profile_fingerprint(0)
    assert one.restart_fingerprint(0) == two.restart_fingerprint(0) != ""
    assert spec(lora=[POEM]).restart_fingerprint(0) == one.restart_fingerprint(0)
    # Anything else in the profile still counts.
    assert spec(lora=[SQL], context_size=8192).restart_fingerprint(0) != one.restart_fingerprint(0)
    # Without adapters vLLM runs without LoRA: the first one needs a restart, and so does
    # dropping the last.
    assert spec().restart_fingerprint(0) == ""
    # llama.cpp's adapters are launch-time.
    assert spec("llamacpp", lora=[SQL]).restart_fingerprint(0) == ""


def state(model: ModelSpec, reported: ModelSpec, restart: bool = True) -> ModelState:
    """Replicas 0 and 1 serving `reported`; 0 says it loads adapters at runtime (if `restart`),
    1 is from before that was reported."""
    return ModelState(
        spec=model,
        indices=[0, 1],
        fingerprints={0: reported.profile_fingerprint(0), 1: reported.profile_fingerprint(0)},
        restart_fingerprints={0: reported.restart_fingerprint(0) if restart else ""},
    )


def test_the_model_tells_replicas_that_can_and_replaces_the_rest() -> None:
    old, new = spec(lora=[SQL]), spec(lora=[SQL, POEM])
    current = state(new, old)
    assert adapter_updates(current) == [0]
    assert adapters_to_tell(current) == [0]
    # Until the run tells replicas (its patch), both are stale, as before.
    assert stale_indices(current) == [0, 1]
    current.adapters_at_runtime = True
    assert stale_indices(current) == [1]
    # Told once per definition.
    current.adapters_told[0] = new.adapters_version()
    assert adapters_to_tell(current) == []
    # A replica that could not load them says so: it is replaced.
    current.restart_fingerprints[0] = ""
    assert adapter_updates(current) == []
    assert stale_indices(current) == [0, 1]


def test_a_change_beyond_the_adapters_or_to_none_replaces_the_replica() -> None:
    old = spec(lora=[SQL])
    for new in (spec(lora=[SQL, POEM], context_size=8192), spec()):
        current = state(new, old)
        current.adapters_at_runtime = True
        assert adapter_updates(current) == []
        assert stale_indices(current) == [0, 1]


def test_a_current_replica_is_neither_told_nor_stale() -> None:
    model = spec(lora=[SQL])
    current = state(model, model)
    current.adapters_at_runtime = True
    assert (adapter_updates(current), stale_indices(current)) == ([], [])


def test_the_replica_checks_its_own_profile_and_fetches_only_new_artifacts() -> None:
    old, new = spec(lora=[SQL]), spec(lora=[SQL, POEM])
    assert takes_adapters_at_runtime(old, new, 0)
    assert not takes_adapters_at_runtime(old, spec(lora=[SQL], context_size=8192), 0)
    assert not takes_adapters_at_runtime(old, spec(), 0)
    assert not takes_adapters_at_runtime(old, new, 1)  # no such profile
    llama = spec("llamacpp", lora=[SQL])
    assert not takes_adapters_at_runtime(llama, spec("llamacpp", lora=[SQL, POEM]), 0)
    assert new_adapter_artifacts(old, new, 0) == [POEM.artifact]
    assert new_adapter_artifacts(new, old, 0) == []
