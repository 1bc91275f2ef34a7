"""`llmgw model import-ollama`, without servers: a fake Ollama store in tmp_path (manifests and
blobs as Ollama lays them out, a few bytes standing in for the GGUF) read, verified and copied
into llmgw's content-addressed models directory, and the model definition built from it."""

import argparse
import hashlib
import json
import os
import re
import struct
from pathlib import Path

import pytest

from engines.llamacpp import command_line
from tests.unit.test_model_commands import NO_CLIENT, parse
from workers.commands import model as model_commands
from workers.ollama import store as ollama_store
from workers.ollama.gguf_header import gguf_has_chat_template
from workers.ollama.model_import import (
    default_memory_mb,
    default_model_name,
    engine_defaults,
    fetch_blobs,
    plan_import,
)
from workers.ollama.store import (
    ADAPTER,
    LICENSE,
    MODEL,
    PARAMS,
    PROJECTOR,
    SYSTEM,
    TEMPLATE,
    Blob,
    NotInStore,
    OllamaModel,
    OllamaStore,
    OllamaStoreError,
    Reference,
    parse_reference,
)
from workers.paths import Locations
from workflows.catalog import validate_model
from workflows.contracts import LoraAdapter, ModelSpec, ModelView


def gguf(chat_template: str | None = "{{ messages }}", padding: bytes = b"weights") -> bytes:
    """A GGUF file's header with one array and, if given, a chat template, then some bytes."""
    kvs = []

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    tokens = [string(t) for t in ("<s>", "</s>", "hi")]
    kvs.append(string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + b"".join(tokens))
    kvs.append(string("general.alignment") + struct.pack("<II", 4, 32))
    if chat_template is not None:
        kvs.append(string("tokenizer.chat_template") + struct.pack("<I", 8) + string(chat_template))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs) + padding


class FakeStore:
    """An Ollama models directory: blobs/sha256-<hex> and manifests/<host>/<ns>/<model>/<tag>."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True)
        (root / "manifests").mkdir()

    def blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (self.root / "blobs" / f"sha256-{digest}").write_bytes(data)
        return f"sha256:{digest}"

    def layer(self, media_type: str, data: bytes) -> dict[str, object]:
        return {"mediaType": media_type, "digest": self.blob(data), "size": len(data)}

    def manifest(
        self,
        name: str,
        layers: list[dict[str, object]],
        host: str = "registry.ollama.ai",
        namespace: str = "library",
        tag: str = "latest",
    ) -> Path:
        path = self.root / "manifests" / host / namespace / name / tag
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": self.layer("application/vnd.docker.container.image.v1+json", b"{}"),
            "layers": layers,
        }
        path.write_text(json.dumps(doc))
        return path

    def path_of(self, digest: str) -> Path:
        return self.root / "blobs" / digest.replace(":", "-")


WEIGHTS = gguf()
PARAMS_JSON = {"stop": ["<|im_start|>", "<|im_end|>"], "temperature": 0.2, "num_ctx": 2048}


@pytest.fixture
def fake(tmp_path: Path) -> FakeStore:
    fake = FakeStore(tmp_path / "ollama")
    fake.manifest(
        "smollm2",
        [
            fake.layer(MODEL, WEIGHTS),
            fake.layer(TEMPLATE, b"{{ .Prompt }}"),
            fake.layer(SYSTEM, b"You are terse."),
            fake.layer(PARAMS, json.dumps(PARAMS_JSON).encode()),
            fake.layer(LICENSE, b"Apache 2.0"),
        ],
        tag="135m",
    )
    return fake


def parse_import(*argv: str) -> argparse.Namespace:
    return parse("import-ollama", *argv)


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("smollm2", Reference("registry.ollama.ai", "library", "smollm2", "latest")),
        ("smollm2:135m", Reference("registry.ollama.ai", "library", "smollm2", "135m")),
        ("llama3.2:1b-q4_K_M", Reference("registry.ollama.ai", "library", "llama3.2", "1b-q4_K_M")),
        ("team/coder:v1", Reference("registry.ollama.ai", "team", "coder", "v1")),
        ("hf.co/org/Model-GGUF:Q4", Reference("hf.co", "org", "Model-GGUF", "Q4")),
        # A port belongs to the host; with no tag after the last '/', the tag is latest.
        ("localhost:5000/team/m", Reference("localhost:5000", "team", "m", "latest")),
        ("localhost:5000/team/m:t", Reference("localhost:5000", "team", "m", "t")),
    ],
)
def test_name_forms_resolve_to_host_namespace_model_and_tag(text: str, expected: Reference) -> None:
    assert parse_reference(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "../etc/passwd",
        "library/../../x",
        "smollm2:..",
        "a..b",
        "/abs/model",
        "team\\model",
        "a/b/c/d",
        "smollm2@sha256:" + "0" * 64,
        "https://registry.ollama.ai/library/x",
        "",
        "smollm2:",
        "-dash",
        "te.am/model",  # a namespace has no dot
        "model name",
        "m\0",
    ],
)
def test_names_that_could_leave_the_manifests_directory_or_are_not_names_are_refused(
    text: str,
) -> None:
    with pytest.raises(OllamaStoreError):
        parse_reference(text)


def test_each_name_form_finds_its_manifest(fake: FakeStore) -> None:
    fake.manifest("plain", [fake.layer(MODEL, WEIGHTS)])
    fake.manifest("coder", [fake.layer(MODEL, WEIGHTS)], namespace="team", tag="v1")
    fake.manifest("m", [fake.layer(MODEL, WEIGHTS)], host="hf.co", namespace="org", tag="Q4")
    store = OllamaStore(fake.root)
    for name in ("plain", "plain:latest", "smollm2:135m", "team/coder:v1", "hf.co/org/m:Q4"):
        found = store.load(parse_reference(name))
        assert found.model.path == fake.path_of(found.model.name).resolve()


def test_default_llmgw_names_are_valid_model_names() -> None:
    cases = {
        "smollm2:135m": "smollm2-135m",
        "llama3": "llama3",
        "llama3:latest": "llama3",
        "team/coder:v1": "team-coder-v1",
        "llama3.2:1b-q4_K_M": "llama3.2-1b-q4_k_m",
        "_under:x": "under-x",
    }
    for ollama, llmgw in cases.items():
        assert default_model_name(parse_reference(ollama)) == llmgw


# --- what is refused ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "digest",
    [
        "sha256:../../../../etc/passwd",
        "sha256:" + "a" * 63,
        "sha256:" + "g" * 64,
        "sha512:" + "a" * 64,
        "sha256:" + "a" * 64 + "/../x",
        " sha256:" + "a" * 64,
        None,
    ],
)
def test_a_layer_digest_of_the_wrong_form_is_refused(fake: FakeStore, digest: str | None) -> None:
    bad: dict[str, object] = {"mediaType": MODEL, "digest": digest, "size": 4}
    fake.manifest("bad", [bad])
    with pytest.raises(OllamaStoreError, match=r"layers\[0\].*digest"):
        OllamaStore(fake.root).load(parse_reference("bad"))


def test_an_upper_case_digest_names_the_same_blob(fake: FakeStore) -> None:
    layer = fake.layer(MODEL, WEIGHTS)
    layer["digest"] = str(layer["digest"]).upper().replace("SHA256", "sha256")
    fake.manifest("upper", [layer])
    found = OllamaStore(fake.root).load(parse_reference("upper"))
    assert found.model.digest == hashlib.sha256(WEIGHTS).hexdigest()


def test_a_blob_linked_out_of_the_store_is_refused_and_one_linked_inside_is_read(
    tmp_path: Path, fake: FakeStore
) -> None:
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(WEIGHTS)
    layer = fake.layer(MODEL, WEIGHTS)
    blob = fake.path_of(str(layer["digest"]))
    blob.unlink()
    blob.symlink_to(outside)
    fake.manifest("linked", [layer])
    store = OllamaStore(fake.root)
    with pytest.raises(OllamaStoreError, match="outside the store"):
        store.load(parse_reference("linked"))

    inside = fake.root / "elsewhere.gguf"
    inside.write_bytes(WEIGHTS)
    blob.unlink()
    blob.symlink_to(inside)
    assert store.load(parse_reference("linked")).model.path == inside.resolve()


def test_a_manifest_linked_out_of_the_store_is_refused(tmp_path: Path, fake: FakeStore) -> None:
    target = fake.manifest("real", [fake.layer(MODEL, WEIGHTS)])
    outside = tmp_path / "manifest.json"
    outside.write_text(target.read_text())
    link = target.parent.parent / "evil" / "latest"
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(OllamaStoreError, match="outside the store"):
        OllamaStore(fake.root).load(parse_reference("evil"))


def test_a_blob_that_is_not_a_regular_file_is_refused(fake: FakeStore) -> None:
    layer = {"mediaType": MODEL, "digest": "sha256:" + "ab" * 32, "size": 4}
    os.mkfifo(fake.path_of(str(layer["digest"])))
    fake.manifest("fifo", [layer])
    with pytest.raises(OllamaStoreError, match="not a regular file"):
        OllamaStore(fake.root).load(parse_reference("fifo"))


def test_a_corrupt_text_layer_is_refused_naming_its_digest(fake: FakeStore) -> None:
    layer = fake.layer(TEMPLATE, b"{{ .Prompt }}")
    fake.path_of(str(layer["digest"])).write_bytes(b"{{ .Evil!! }}")  # the same length
    fake.manifest("corrupt", [fake.layer(MODEL, WEIGHTS), layer])
    with pytest.raises(OllamaStoreError, match=f"blob {layer['digest']} is corrupt"):
        OllamaStore(fake.root).load(parse_reference("corrupt"))


def test_a_blob_of_another_size_than_declared_is_refused(fake: FakeStore) -> None:
    layer = fake.layer(MODEL, WEIGHTS)
    layer["size"] = len(WEIGHTS) + 1
    fake.manifest("short", [layer])
    with pytest.raises(OllamaStoreError, match=f"blob {layer['digest']} is .* bytes"):
        OllamaStore(fake.root).load(parse_reference("short"))


def test_a_model_layer_that_is_not_gguf_is_refused(fake: FakeStore) -> None:
    fake.manifest("notgguf", [fake.layer(MODEL, b"PK\x03\x04 a zip")])
    with pytest.raises(OllamaStoreError, match="not a GGUF file"):
        OllamaStore(fake.root).load(parse_reference("notgguf"))


def test_a_manifest_without_exactly_one_model_layer_is_refused(fake: FakeStore) -> None:
    fake.manifest("none", [fake.layer(TEMPLATE, b"x")])
    fake.manifest("two", [fake.layer(MODEL, WEIGHTS), fake.layer(MODEL, gguf(None))])
    store = OllamaStore(fake.root)
    with pytest.raises(OllamaStoreError, match=r"has no application/vnd\.ollama\.image\.model"):
        store.load(parse_reference("none"))
    with pytest.raises(OllamaStoreError, match=r"2 application/vnd\.ollama\.image\.model layers"):
        store.load(parse_reference("two"))


def test_an_oversized_or_malformed_manifest_is_refused(fake: FakeStore) -> None:
    path = fake.manifest("huge", [fake.layer(MODEL, WEIGHTS)])
    path.write_bytes(b" " * (ollama_store.MAX_MANIFEST_BYTES + 1))
    store = OllamaStore(fake.root)
    with pytest.raises(OllamaStoreError, match="more than"):
        store.load(parse_reference("huge"))
    for text in ("[]", '{"schemaVersion": 1, "layers": []}', "{not json", '{"schemaVersion": 2}'):
        path.write_text(text)
        with pytest.raises(OllamaStoreError, match="manifest"):
            store.load(parse_reference("huge"))


def test_an_absent_model_tag_or_store_is_named(tmp_path: Path, fake: FakeStore) -> None:
    store = OllamaStore(fake.root)
    with pytest.raises(NotInStore, match=r"no model nope:latest .*ollama pull nope:latest"):
        store.load(parse_reference("nope"))
    with pytest.raises(NotInStore, match=r"no tag '7b' of smollm2:7b .*\(it has 135m\)"):
        store.load(parse_reference("smollm2:7b"))
    with pytest.raises(NotInStore, match=f"no Ollama store at {tmp_path / 'absent'}"):
        OllamaStore(tmp_path / "absent")


def test_the_store_defaults_to_ollama_models_then_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "m"))
    assert ollama_store.default_store() == tmp_path / "m"
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ollama_store.default_store() == tmp_path / ".ollama" / "models"


# --- the layers -----------------------------------------------------------------------------


def test_the_layers_are_read_and_verified(fake: FakeStore) -> None:
    found = OllamaStore(fake.root).load(parse_reference("smollm2:135m"))
    assert found.model.digest == hashlib.sha256(WEIGHTS).hexdigest()
    assert found.model.size == len(WEIGHTS)
    assert (found.template, found.system) == ("{{ .Prompt }}", "You are terse.")
    assert found.params == PARAMS_JSON
    assert found.unused == {LICENSE: 1}
    assert gguf_has_chat_template(found.model.path) is True


def test_the_gguf_header_says_whether_it_embeds_a_chat_template(tmp_path: Path) -> None:
    with_one, without, broken = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    with_one.write_bytes(gguf("{% for m in messages %}{% endfor %}"))
    without.write_bytes(gguf(None))
    broken.write_bytes(gguf()[:30])
    assert gguf_has_chat_template(with_one) is True
    assert gguf_has_chat_template(without) is False
    assert gguf_has_chat_template(broken) is None


def test_ollama_params_become_llama_server_defaults() -> None:
    got = engine_defaults(
        {
            "stop": ["<|im_end|>", "", "<|im_end|>", "--port"],
            "temperature": 0.7,
            "top_k": 40.0,
            "seed": -1,
            "num_ctx": 8192,
            "num_gpu": 99,
            "num_thread": 8,
        }
    )
    assert got.args == [
        "--seed", "-1",
        "--reverse-prompt", "<|im_end|>",
        "--temp", "0.7",
        "--top-k", "40",
    ]  # fmt: skip
    assert got.context_size == 8192
    assert got.left_out == ["num_gpu", "num_thread", "stop '--port' (it cannot be passed on "
                            "llama-server's command line)"]  # fmt: skip


@pytest.mark.parametrize(
    "params", [{"temperature": "hot"}, {"top_k": 4.5}, {"stop": [1]}, {"seed": True}]
)
def test_malformed_params_are_refused_naming_the_param(params: dict[str, object]) -> None:
    with pytest.raises(OllamaStoreError, match=f"params: {next(iter(params))}"):
        engine_defaults(params)


# --- the import -----------------------------------------------------------------------------


def test_the_import_defines_a_llamacpp_model_on_the_content_addressed_copy(
    tmp_path: Path, fake: FakeStore
) -> None:
    models = tmp_path / "state" / "models"
    plan = plan_import(
        parse_import("smollm2:135m", "--store", str(fake.root), "--cpu-cores", "1"), models, {}
    )
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    spec = plan.spec
    assert spec.name == "smollm2-135m"
    assert spec.weights == str(models / f"sha256-{digest}.gguf")
    profile = spec.profiles[0]
    assert (profile.engine, profile.cpu_cores, profile.memory_mb) == ("llamacpp", 1, 1024)
    assert profile.context_size == 2048  # num_ctx
    assert profile.args == [
        "--reverse-prompt", "<|im_start|>", "--reverse-prompt", "<|im_end|>", "--temp", "0.2",
    ]  # fmt: skip
    validate_model(spec)
    assert any("Go template is not used" in note for note in plan.notes)
    assert any("system prompt is not used" in warning for warning in plan.warnings)
    assert not (models / f"sha256-{digest}.gguf").exists()  # planning copies nothing

    lines = fetch_blobs(plan)
    final = models / f"sha256-{digest}.gguf"
    assert final.read_bytes() == WEIGHTS
    assert "copied and verified" in lines[0]
    assert sorted(p.name for p in models.iterdir()) == [final.name]  # no temporary file left

    second = plan_import(parse_import("smollm2:135m", "--store", str(fake.root)), models, {})
    again = fetch_blobs(second)
    assert "already there, verified" in again[0]
    assert final.read_bytes() == WEIGHTS


def test_the_flags_win_over_ollama_and_as_names_the_model(tmp_path: Path, fake: FakeStore) -> None:
    args = parse_import(
        "smollm2:135m", "--store", str(fake.root), "--as", "tiny", "--context-size", "1024",
        "--memory-mb", "700", "--no-params", "--arg=--top-k", "--arg=5",
    )  # fmt: skip
    plan = plan_import(args, tmp_path / "models", {})
    assert plan.spec.name == "tiny"
    profile = plan.spec.profiles[0]
    assert (profile.context_size, profile.memory_mb) == (1024, 700)
    assert profile.args == ["--top-k", "5"]


def test_a_cpu_replica_s_memory_follows_the_weights_size(tmp_path: Path, fake: FakeStore) -> None:
    small = plan_import(parse_import("smollm2:135m", "--store", str(fake.root)), tmp_path, {})
    assert small.spec.profiles[0].memory_mb == 1024  # as `model add` assumes
    gib = 1 << 30
    big = OllamaModel(
        reference=parse_reference("big"),
        manifest=tmp_path / "manifest",
        model=Blob("0" * 64, 4 * gib + 1, tmp_path / "weights"),
        adapters=[Blob("1" * 64, gib, tmp_path / "adapter")],
    )
    assert default_memory_mb(big, None) == 5 * 1024 + 1 + 512  # MiB, rounded up, + 512
    assert default_memory_mb(big, "h100-80g") == 1024  # on GPUs the weights go to the GPUs


def test_a_corrupt_model_blob_is_refused_and_leaves_nothing_at_the_final_path(
    tmp_path: Path, fake: FakeStore
) -> None:
    layer = fake.layer(MODEL, WEIGHTS)
    blob = fake.path_of(str(layer["digest"]))
    blob.write_bytes(WEIGHTS[:-1] + b"X")  # the same size, another content
    fake.manifest("corrupt", [layer])
    models = tmp_path / "models"
    plan = plan_import(parse_import("corrupt", "--store", str(fake.root)), models, {})
    with pytest.raises(OllamaStoreError, match=f"blob {layer['digest']} is corrupt"):
        fetch_blobs(plan)
    assert list(models.iterdir()) == []


def test_a_copy_that_fails_midway_leaves_nothing_at_the_final_path(
    tmp_path: Path, fake: FakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    plan = plan_import(parse_import("smollm2:135m", "--store", str(fake.root)), models, {})

    def full_disk(*_paths: str) -> None:
        raise OSError(28, "No space left on device")

    # blobs moves the verified copy into place with os.replace (the one os module).
    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        fetch_blobs(plan)
    assert list(models.iterdir()) == []


def test_a_damaged_copy_already_there_is_replaced_by_a_verified_one(
    tmp_path: Path, fake: FakeStore
) -> None:
    models = tmp_path / "models"
    plan = plan_import(parse_import("smollm2:135m", "--store", str(fake.root)), models, {})
    fetch_blobs(plan)
    final = Path(plan.spec.weights)
    final.write_bytes(b"X" * len(WEIGHTS))
    assert "copied and verified" in fetch_blobs(plan)[0]
    assert final.read_bytes() == WEIGHTS


def test_adapters_become_lora_adapters_and_a_projector_is_served_with_mmproj(
    tmp_path: Path, fake: FakeStore
) -> None:
    adapter = gguf(None, b"lora")
    projector = gguf(None, b"mmproj")
    fake.manifest(
        "vision",
        [
            fake.layer(MODEL, WEIGHTS),
            fake.layer(ADAPTER, adapter),
            fake.layer(PROJECTOR, projector),
        ],
    )
    models = tmp_path / "models"
    plan = plan_import(parse_import("vision", "--store", str(fake.root)), models, {})
    adapter_path = models / f"sha256-{hashlib.sha256(adapter).hexdigest()}.gguf"
    projector_path = models / f"sha256-{hashlib.sha256(projector).hexdigest()}.gguf"
    profile = plan.spec.profiles[0]
    assert profile.lora == [LoraAdapter(name="adapter", path=str(adapter_path))]
    assert profile.args[-2:] == ["--mmproj", str(projector_path)]
    assert any("--mmproj" in n for n in plan.notes)
    assert not any("projector" in w for w in plan.warnings)
    assert any("adapters unapplied" in w for w in plan.warnings)
    fetch_blobs(plan)
    assert adapter_path.read_bytes() == adapter
    assert projector_path.read_bytes() == projector
    assert len(list(models.iterdir())) == 3  # the weights, the adapter and the projector
    # llama-server's command line carries it (the agent's launch path builds it).
    argv = command_line("/x/llama-server", plan.spec, profile, "127.0.0.1", 8080, 2)
    assert argv[argv.index("--mmproj") + 1] == str(projector_path)


def test_an_operators_projector_wins_and_a_second_one_is_warned_about(
    tmp_path: Path, fake: FakeStore
) -> None:
    fake.manifest(
        "two",
        [
            fake.layer(MODEL, WEIGHTS),
            fake.layer(PROJECTOR, gguf(None, b"one")),
            fake.layer(PROJECTOR, gguf(None, b"two")),
        ],
    )
    plan = plan_import(parse_import("two", "--store", str(fake.root)), tmp_path / "m", {})
    assert plan.spec.profiles[0].args.count("--mmproj") == 1
    assert any("2 projector layers" in w for w in plan.warnings)
    mine = ["two", "--store", str(fake.root), "--arg=--mmproj", "--arg=/mine.gguf"]
    plan = plan_import(parse_import(*mine), tmp_path / "m", {})
    assert plan.spec.profiles[0].args == ["--mmproj", "/mine.gguf"]
    assert len(plan.blobs) == 1  # the weights: the operator's projector is not copied


def test_a_model_without_an_embedded_chat_template_is_warned_about(
    tmp_path: Path, fake: FakeStore
) -> None:
    fake.manifest("bare", [fake.layer(MODEL, gguf(None))])
    plan = plan_import(parse_import("bare", "--store", str(fake.root)), tmp_path / "m", {})
    assert any("embeds no chat template" in w for w in plan.warnings)


# --- the command ----------------------------------------------------------------------------


async def test_the_command_copies_then_defines_the_model_as_model_add_does(
    tmp_path: Path,
    fake: FakeStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    applied: list[ModelSpec] = []

    async def apply_model(_client: object, spec: ModelSpec) -> ModelView:
        # The weights are in place, verified, before the model is defined.
        assert hashlib.sha256(Path(spec.weights).read_bytes()).hexdigest() in spec.weights
        applied.append(spec)
        return ModelView(spec=spec)

    monkeypatch.setattr(model_commands, "apply_model", apply_model)
    where = Locations.resolve(state_dir=str(tmp_path / "state"))
    args = parse_import("smollm2:135m", "--store", str(fake.root), "--env", "A=b")
    await model_commands.model_command(args, client=NO_CLIENT, where=where)
    (spec,) = applied
    assert Path(spec.weights).parent == where.models_dir
    assert spec.profiles[0].env == {"A": "b"}
    out = capsys.readouterr()
    assert "copied and verified" in out.out
    assert "model smollm2-135m: 1 replica(s) wanted" in out.out
    assert "warning: system" in out.err


async def test_the_command_refuses_with_the_reason_and_defines_nothing(
    tmp_path: Path, fake: FakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def apply_model(_client: object, _spec: ModelSpec) -> ModelView:
        raise AssertionError("nothing may be defined")

    monkeypatch.setattr(model_commands, "apply_model", apply_model)
    where = Locations.resolve(state_dir=str(tmp_path / "state"))
    for argv, reason in [
        (("../x", "--store", str(fake.root)), "import-ollama ../x: '../x' is not an Ollama"),
        (("nope", "--store", str(fake.root)), "import-ollama nope: no model nope:latest"),
        # The definition is checked before anything is copied.
        (("smollm2:135m", "--store", str(fake.root), "--env", "LD_PRELOAD=x"), "LD_PRELOAD"),
    ]:
        with pytest.raises(SystemExit, match=re.escape(reason)):
            await model_commands.model_command(parse_import(*argv), client=NO_CLIENT, where=where)
    assert not where.models_dir.exists()
