"""`llmgw model add|apply|rm|why` without Temporal: for external models the spec built, and the
upstream key read from a file or the environment into the store, never into the spec; a model
added from a file defined by its artifact and size; and `why` on weights in the mirror."""

import argparse
from pathlib import Path
from typing import cast

import pytest
from temporalio.client import Client

from workers.cli import build_parser
from workers.commands import model as model_commands
from workers.commands.model import models_from_file, spec_from_args
from workers.commands.upstream_key import upstream_key_from_args
from workers.paths import Locations
from workflows.artifact_names import artifact_hint
from workflows.contracts import (
    EngineState,
    EngineStatus,
    LedgerState,
    ModelSpec,
    ModelView,
    NodeInventory,
    NodeRecord,
    NodeState,
    Profile,
)

KEY = "sk-upstream-0123456789"
# The commands here only reach the client through the stand-ins below, which never use it.
NO_CLIENT = cast(Client, None)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["model", *argv])


def test_model_add_external_builds_one_profile_with_a_replica_per_url() -> None:
    args = parse(
        "add", "mock", "--engine", "external",
        "--url", "http://127.0.0.1:9000", "--url", "http://127.0.0.1:9001/v1",
    )  # fmt: skip
    spec = spec_from_args(args)
    assert spec.profiles == [
        Profile(engine="external", urls=["http://127.0.0.1:9000", "http://127.0.0.1:9001/v1"])
    ]
    assert (spec.name, spec.weights, spec.replicas) == ("mock", "", 2)
    assert upstream_key_from_args(args) is None


def test_model_add_external_takes_the_name_the_endpoint_knows_the_model_by() -> None:
    args = parse(
        "add", "small", "--engine", "external", "--url", "https://api.example.com/v1",
        "--upstream-model", "org/Hosted-8B",
    )  # fmt: skip
    profile = spec_from_args(args).profiles[0]
    assert profile.upstream_model == "org/Hosted-8B"
    assert model_commands.describe_profile(profile) == (
        "external https://api.example.com/v1 as org/Hosted-8B"
    )
    with pytest.raises(SystemExit, match=r"profiles\[0\].upstream_model: only engine external"):
        spec_from_args(parse("add", "m", "--weights", "/w/m.gguf", "--upstream-model", "x"))


def test_model_add_external_names_what_it_does_not_take() -> None:
    args = parse("add", "mock", "--engine", "external", "--url", "http://h:1", "--tp", "2")
    with pytest.raises(SystemExit, match=r"profiles\[0\].tensor_parallel: external endpoints"):
        spec_from_args(args)
    with pytest.raises(SystemExit, match=r"profiles\[0\].urls: an external model needs 1 to 64"):
        spec_from_args(parse("add", "mock", "--engine", "external"))


def test_other_engines_still_need_weights_and_refuse_urls() -> None:
    with pytest.raises(SystemExit, match="weights: engine llamacpp needs"):
        spec_from_args(parse("add", "m"))
    with pytest.raises(SystemExit, match=r"profiles\[0\].urls: only engine external"):
        spec_from_args(parse("add", "m", "--weights", "/w/m.gguf", "--url", "http://h:1"))


def test_upstream_key_file_is_read_and_its_newline_stripped(tmp_path: Path) -> None:
    key_file = tmp_path / "upstream.key"
    key_file.write_text(KEY + "\n")
    args = parse(
        "add", "mock", "--engine", "external", "--url", "http://127.0.0.1:9000",
        "--upstream-key-file", str(key_file),
    )  # fmt: skip
    assert upstream_key_from_args(args) == KEY
    assert KEY not in spec_from_args(args).model_dump_json()


def test_upstream_key_env_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOCK_KEY", KEY)
    args = parse(
        "add", "mock", "--engine", "external", "--url", "http://h:1", "--upstream-key-env",
        "MOCK_KEY",
    )  # fmt: skip
    assert upstream_key_from_args(args) == KEY
    monkeypatch.delenv("MOCK_KEY")
    with pytest.raises(SystemExit, match=r"\$MOCK_KEY is not set"):
        upstream_key_from_args(args)


@pytest.mark.parametrize(
    ("text", "expected"), [("\n", "is empty"), ("two words\n", "one line of visible ASCII")]
)
def test_an_unusable_key_file_is_refused_without_quoting_it(
    tmp_path: Path, text: str, expected: str
) -> None:
    key_file = tmp_path / "upstream.key"
    key_file.write_text(text)
    args = parse(
        "add", "mock", "--engine", "external", "--url", "http://h:1",
        "--upstream-key-file", str(key_file),
    )  # fmt: skip
    with pytest.raises(SystemExit, match=expected) as refused:
        upstream_key_from_args(args)
    assert "words" not in str(refused.value)


def test_no_flag_takes_the_key_itself_and_other_engines_take_none(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse("add", "mock", "--engine", "external", "--url", "http://h:1", "--upstream-key", KEY)
    with pytest.raises(SystemExit):
        parse("add", "m", "--upstream-key-file", "a", "--upstream-key-env", "B")
    key_file = tmp_path / "k"
    key_file.write_text(KEY)
    args = parse("add", "m", "--weights", "/w/m.gguf", "--upstream-key-file", str(key_file))
    with pytest.raises(SystemExit, match="for --engine external only"):
        upstream_key_from_args(args)


def test_a_yaml_file_names_the_key_file_relative_to_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "mock.key").write_text(KEY + "\n")
    monkeypatch.setenv("OTHER_KEY", "sk-other")
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n"
        "  - name: mock\n"
        "    engine: external\n"
        "    urls: [http://127.0.0.1:9000, http://127.0.0.1:9001]\n"
        "    upstream_key_file: keys/mock.key\n"
        "  - name: other\n"
        "    engine: external\n"
        "    urls: [https://api.example.com/v1]\n"
        "    upstream_key_env: OTHER_KEY\n"
        "  - name: local\n"
        "    weights: m.gguf\n"
        "    memory_mb: 512\n"
    )
    mock, other, local = models_from_file(models)
    assert (mock.spec.replicas, mock.upstream_key) == (2, KEY)
    assert (other.spec.profiles[0].urls, other.upstream_key) == (
        ["https://api.example.com/v1"],
        "sk-other",
    )
    assert (local.spec.weights, local.upstream_key) == (str(tmp_path / "m.gguf"), None)


def test_a_yaml_file_may_not_hold_the_key_itself(tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        f"- name: mock\n  engine: external\n  urls: [http://h:1]\n  upstream_key: {KEY}\n"
    )
    with pytest.raises(SystemExit, match="not the key itself") as refused:
        models_from_file(models)
    assert KEY not in str(refused.value)


class FakeStore:
    """The gateway store's upstream-key calls, as `llmgw model` makes them."""

    def __init__(self, calls: list[tuple[str, ...]]) -> None:
        self.calls = calls

    async def init(self) -> None:
        self.calls.append(("init",))

    async def set_upstream_key(self, model: str, key: str | None) -> None:
        self.calls.append(("set_upstream_key", model, str(key)))

    async def close(self) -> None:
        self.calls.append(("close",))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """Stand-ins for the store and the model client; what each was asked, in order."""
    calls: list[tuple[str, ...]] = []

    def open_store(_database_url: str | None, state_dir: Path) -> FakeStore:
        assert state_dir == tmp_path
        return FakeStore(calls)

    async def apply_model(_client: object, spec: ModelSpec) -> ModelView:
        calls.append(("apply", spec.model_dump_json()))
        return ModelView(spec=spec)

    async def describe_model(_client: object, name: str) -> ModelView:
        profile = Profile(engine="external", urls=["http://h:1"])
        return ModelView(spec=ModelSpec(name=name, profiles=[profile]))

    async def remove_model(_client: object, name: str) -> ModelView:
        calls.append(("remove", name))
        return ModelView(spec=ModelSpec(name=name, weights="/w"), removing=True)

    monkeypatch.setattr(model_commands, "open_store", open_store)
    monkeypatch.setattr(model_commands, "apply_model", apply_model)
    monkeypatch.setattr(model_commands, "describe_model", describe_model)
    monkeypatch.setattr(model_commands, "remove_model", remove_model)
    return calls


async def test_add_stores_the_key_before_the_model_and_rm_deletes_it(
    calls: list[tuple[str, ...]], tmp_path: Path
) -> None:
    where = Locations.resolve(state_dir=str(tmp_path))
    key_file = tmp_path / "upstream.key"
    key_file.write_text(KEY + "\n")
    args = parse(
        "add", "mock", "--engine", "external", "--url", "http://127.0.0.1:9000",
        "--upstream-key-file", str(key_file),
    )  # fmt: skip
    await model_commands.model_command(args, client=NO_CLIENT, where=where)
    assert [c[0] for c in calls] == ["init", "set_upstream_key", "close", "apply"]
    assert calls[1] == ("set_upstream_key", "mock", KEY)
    assert KEY not in calls[3][1]

    calls.clear()
    await model_commands.model_command(parse("rm", "mock"), client=NO_CLIENT, where=where)
    assert calls == [
        ("remove", "mock"),
        ("init",),
        ("set_upstream_key", "mock", "None"),
        ("close",),
    ]


async def test_add_from_a_file_records_the_artifacts_size_for_placement(
    calls: list[tuple[str, ...]], tmp_path: Path
) -> None:
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF" + bytes(5000))
    where = Locations.resolve(state_dir=str(tmp_path))
    args = parse("add", "tiny", "--from", str(weights), "--memory-mb", "1024")
    await model_commands.model_command(args, client=NO_CLIENT, where=where)
    [applied] = [ModelSpec.model_validate_json(c[1]) for c in calls if c[0] == "apply"]
    assert applied.artifact.startswith("sha256:")
    assert (applied.weights, applied.artifact_size) == ("tiny.gguf", 5004)


GB = 10**9
WEIGHTS = "sha256:" + "5a" * 32


def fleet_node(name: str, free_mb: int | None, held: list[str]) -> NodeRecord:
    inventory = NodeInventory(
        name=name, cpu_cores=8, memory_mb=16384, artifacts=held, artifact_disk_free_mb=free_mb
    )
    engines = {
        "llamacpp": EngineStatus(engine="llamacpp", version="1", state=EngineState.INSTALLED)
    }
    return NodeRecord(inventory=inventory, state=NodeState.READY, engines=engines)


async def test_model_why_says_which_nodes_hold_the_weights_and_which_lack_the_disk(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = ModelSpec(
        name="big",
        weights="model.gguf",
        artifact=WEIGHTS,
        artifact_size=2 * GB,
        profiles=[Profile(cpu_cores=2, memory_mb=4096)],
    )
    state = LedgerState(
        nodes={
            "holder": fleet_node("holder", 0, [artifact_hint(WEIGHTS)]),
            "roomy": fleet_node("roomy", 80_000, []),
            "full": fleet_node("full", 900, []),
            "old-agent": fleet_node("old-agent", None, []),
        }
    )

    async def list_models(_client: object) -> list[ModelView]:
        return [ModelView(spec=spec)]

    async def ledger_snapshot(_client: object) -> LedgerState:
        return state

    monkeypatch.setattr(model_commands, "list_models", list_models)
    monkeypatch.setattr(model_commands, "ledger_snapshot", ledger_snapshot)
    where = Locations.resolve(state_dir=str(tmp_path))
    await model_commands.model_command(parse("why", "big"), client=NO_CLIENT, where=where)
    passed_over = "fits, but would fetch the weights (2.0 GB): passed over for a node holding them"
    assert capsys.readouterr().out.splitlines() == [
        "profile 1 (llamacpp cpu): would go to holder",
        "  full: needs 2.5 GB of disk for the weights, 900 MB free",
        "  holder: fits, holds the weights",
        f"  old-agent: {passed_over}",
        f"  roomy: {passed_over}",
    ]
