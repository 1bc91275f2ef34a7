"""An external model's KV-event sources: `llmgw model add --kv-event-source ...`, the same in
YAML, the catalog's checks, and the KvSource each URL's route carries."""

from pathlib import Path

import pytest

from workers.cli import build_parser
from workers.commands.model import describe_profile, models_from_file, spec_from_args
from workflows.catalog import check_model
from workflows.contracts import (
    ExternalKv,
    KvEventSource,
    KvSource,
    ModelSpec,
    Profile,
    ReplicaState,
)
from workflows.model.rules import external_route

A, B = "http://10.0.0.5:8000", "http://10.0.0.6:8000/v1"


def add(*argv: str) -> ModelSpec:
    return spec_from_args(build_parser().parse_args(["model", "add", "m", *argv]))


def external_args(*extra: str) -> tuple[str, ...]:
    return ("--engine", "external", "--url", A, "--url", B, *extra)


def test_one_source_per_url_goes_into_the_spec_and_onto_that_urls_route() -> None:
    spec = add(
        *external_args(
            "--kv-event-source", "tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558",
            "--kv-event-source", "tcp://vllm-b.internal:5557,topic=kv",
            "--kv-block-size", "32", "--kv-hash-seed", "0",
        )
    )  # fmt: skip
    assert spec.profiles[0].external_kv == ExternalKv(
        sources=[
            KvEventSource(endpoint="tcp://10.0.0.5:5557", replay="tcp://10.0.0.5:5558"),
            KvEventSource(endpoint="tcp://vllm-b.internal:5557", topic="kv"),
        ],
        block_size=32,
        hash_seed="0",
    )
    assert describe_profile(spec.profiles[0]) == f"external {A} {B}, KV events"
    # Each URL's route names its own engine's publisher, with the hashing the router needs.
    second = external_route(spec, "m/ext-1", "http://10.0.0.6:8000", ReplicaState.READY)
    assert second.kv == KvSource(
        block_size=32, hash_seed="0", publisher="tcp://vllm-b.internal:5557", topic="kv"
    )
    first = external_route(spec, "m/ext-0", "http://10.0.0.5:8000", ReplicaState.READY)
    assert first.kv is not None
    assert (first.kv.publisher, first.kv.replay, first.kv.feed) == (
        "tcp://10.0.0.5:5557",
        "tcp://10.0.0.5:5558",
        "",
    )
    # A URL no longer listed (its route being withdrawn) has no source.
    gone = external_route(spec, "m/ext-9", "http://10.0.0.7:8000", ReplicaState.STOPPED)
    assert gone.kv is None


def test_without_sources_routes_have_no_kv_and_the_fingerprint_is_unchanged() -> None:
    plain = add(*external_args())
    assert plain.profiles[0].external_kv is None
    assert external_route(plain, "m/ext-0", "http://10.0.0.5:8000", ReplicaState.READY).kv is None
    # A definition from before external_kv existed keeps its fingerprint, so nothing rolls.
    before = Profile(engine="external", urls=[A, B])
    assert plain.profile_fingerprint(0) == ModelSpec(
        name="m", profiles=[before]
    ).profile_fingerprint(0)
    with_kv = add(
        *external_args(
            "--kv-event-source",
            "tcp://h:1",
            "--kv-event-source",
            "tcp://g:1",
            "--kv-block-size",
            "16",
        )
    )
    assert with_kv.profile_fingerprint(0) != plain.profile_fingerprint(0)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--kv-event-source", "tcp://h:1"), r"one per --url, in the same order: 2 --url, 1"),
        (
            ("--kv-event-source", "tcp://h:1", "--kv-event-source", "tcp://g:1"),
            r"--kv-block-size: give the engines' --block-size",
        ),
        (("--kv-block-size", "16"), r"--kv-block-size goes with --kv-event-source"),
        (("--kv-hash-seed", "0"), r"--kv-hash-seed goes with --kv-event-source"),
    ],
)
def test_the_options_must_come_together_and_match_the_urls(
    extra: tuple[str, ...], expected: str
) -> None:
    with pytest.raises(SystemExit, match=expected):
        add(*external_args(*extra))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("tcp://*:5557", r"endpoint 'tcp://\*:5557' is a wildcard, the address the engine binds"),
        ("tcp://0.0.0.0:5557", r"is a wildcard"),
        ("tcp://[::]:5557", r"is a wildcard"),
        ("ipc:///tmp/kv", r"must be tcp://HOST:PORT: the gateway connects over TCP"),
        ("http://h:5557", r"must be tcp://HOST:PORT"),
        ("tcp://h", r"must end with :PORT, a port from 1 to 65535"),
        ("tcp://h:0", r"must end with :PORT"),
        ("tcp://h:65536", r"must end with :PORT"),
        ("tcp://h_x:1", r"'h_x' is not a host name or an IP address"),
        ("tcp://999.1.1.1:1", r"is not a host name or an IP address"),
        ("tcp://::1:1", r"an IPv6 address goes in brackets, tcp://\[::1\]:1"),
        ("tcp://h:1,replay=tcp://*:2", r"replay 'tcp://\*:2' is a wildcard"),
        ("tcp://h:1,reply=tcp://h:2", r"after the endpoint come replay=... and topic=..."),
        ("tcp://h:1,topic=a,topic=b", r"topic is given twice"),
    ],
)
def test_a_source_the_gateway_cannot_connect_to_is_refused_by_name(
    source: str, expected: str
) -> None:
    argv = external_args(
        "--kv-event-source", source, "--kv-event-source", "tcp://[fd00::6]:5557",
        "--kv-block-size", "16",
    )  # fmt: skip
    with pytest.raises(SystemExit, match=r"--kv-event-source #1") as refused:
        add(*argv)
    assert refused.match(expected)


def test_other_engines_take_no_source() -> None:
    with pytest.raises(SystemExit, match="is for --engine external; a vllm model llmgw runs"):
        add("--engine", "vllm", "--weights", "/w", "--kv-event-source", "tcp://h:1")
    launched = Profile(
        engine="vllm",
        gpu_class="h100-80g",
        gpus_per_node=1,
        external_kv=ExternalKv(sources=[KvEventSource(endpoint="tcp://h:1")], block_size=16),
    )
    problems = check_model(ModelSpec(name="m", weights="/w", profiles=[launched]))
    assert problems == [
        "profiles[0].external_kv: only engine external takes it; a vllm replica llmgw runs "
        "publishes its KV events with kv_events"
    ]


def external_kv_problems(kv: ExternalKv, urls: list[str] = [A, B]) -> list[str]:  # noqa: B006
    profile = Profile(engine="external", urls=urls, external_kv=kv)
    return check_model(ModelSpec(name="m", profiles=[profile]))


def test_the_catalog_checks_what_yaml_and_the_admin_api_send() -> None:
    one = KvEventSource(endpoint="tcp://h:1")
    assert external_kv_problems(ExternalKv(sources=[one], block_size=16)) == [
        "profiles[0].external_kv.sources: one per URL, in the order of urls: 2 URL(s), 1 source(s)"
    ]
    assert external_kv_problems(ExternalKv(sources=[one, one], block_size=0, hash_seed="x")) == [
        "profiles[0].external_kv.sources: the same publisher is listed twice",
        "profiles[0].external_kv.block_size: the engines' --block-size, 1 to 4096, not 0",
        "profiles[0].external_kv.hash_seed: the engines' PYTHONHASHSEED, an integer from 0 to "
        "4294967295, not 'x'",
    ]
    same = KvEventSource(endpoint="tcp://h:1", replay="tcp://h:1", topic="a\nb")
    assert external_kv_problems(ExternalKv(sources=[same], block_size=16), [A]) == [
        "profiles[0].external_kv.sources[0].replay: the replay socket has a port of its own",
        "profiles[0].external_kv.sources[0].topic: at most 256 printable characters",
    ]
    assert external_kv_problems(
        ExternalKv(sources=[one], block_size=16, hash_seed="4294967296"), [A]
    )
    assert external_kv_problems(ExternalKv(sources=[one], block_size=16, hash_seed="42"), [A]) == []


def test_a_yaml_file_declares_the_sources(tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n"
        "  - name: fleet\n"
        "    engine: external\n"
        f"    urls: [{A}, {B}]\n"
        "    external_kv:\n"
        "      block_size: 16\n"
        "      hash_seed: '0'\n"
        "      sources:\n"
        "        - {endpoint: 'tcp://10.0.0.5:5557', replay: 'tcp://10.0.0.5:5558'}\n"
        "        - {endpoint: 'tcp://*:5557'}\n"
    )
    with pytest.raises(
        SystemExit, match=r"external_kv.sources\[1\].endpoint: 'tcp://\*:5557' is a wildcard"
    ):
        models_from_file(models)
    models.write_text(models.read_text().replace("tcp://*:5557", "tcp://10.0.0.6:5557"))
    (declared,) = models_from_file(models)
    kv = declared.spec.profiles[0].external_kv
    assert kv is not None
    assert [s.endpoint for s in kv.sources] == ["tcp://10.0.0.5:5557", "tcp://10.0.0.6:5557"]
    assert (kv.block_size, kv.hash_seed) == (16, "0")
