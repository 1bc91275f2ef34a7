"""vLLM's commands and environment: the key stays off the command line, the CPU fixes are there
on the CPU only, an operator's args cannot take over what llmgw decides, and a multi-node
replica is launched as vLLM documents it (mp: every node serves with its rank, workers
headless; Ray: a head sidecar then the server on the leader, a join alone on a worker)."""

import json

import pytest

from engines.commands import Command, ShardPlace
from engines.vllm import block_size, command_line, engine_env, launch_commands
from workflows.contracts import LoraAdapter, ModelSpec, Profile

MODEL = ModelSpec(name="tiny", weights="/models/tiny", profiles=[Profile(engine="vllm")])
ONE = ShardPlace(address="10.0.0.1", port=18001)


def profile(**kw: object) -> Profile:
    return Profile.model_validate({"engine": "vllm", **kw})


def pairs(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}


def shard(rank: int, address: str, nodes: int = 2, gpus: int = 8) -> ShardPlace:
    return ShardPlace(
        address=address,
        port=18001 + rank,
        rank=rank,
        nodes=nodes,
        leader_address="10.0.0.1",
        rendezvous_port=28001,
        gpus=[f"GPU-{rank}-{i}" for i in range(gpus)],
        cpu_cores=32,
    )


def test_cpu_command_line() -> None:
    argv = command_line(
        "/e/venv/bin/vllm", MODEL, profile(context_size=2048, parallel=4), ONE, cpu=True
    )
    assert argv[:3] == ["/e/venv/bin/vllm", "serve", "/models/tiny"]
    flags = pairs(argv)
    assert flags["--host"] == "10.0.0.1"
    assert flags["--port"] == "18001"
    assert flags["--served-model-name"] == "tiny"
    assert flags["--max-model-len"] == "2048"
    assert flags["--max-num-seqs"] == "4"
    assert flags["--block-size"] == "32"
    assert "--enforce-eager" in argv
    assert "--enable-prefix-caching" in argv
    # One node, one GPU or none: no parallelism flags, no multi-node flags.
    for absent in ("--tensor-parallel-size", "--nnodes", "--headless", "--kv-events-config"):
        assert absent not in argv


def test_gpu_command_line_keeps_vllms_own_defaults() -> None:
    argv = command_line("vllm", MODEL, profile(), ONE, cpu=False)
    assert "--block-size" not in argv
    assert "--enforce-eager" not in argv


def test_parallelism_and_quantization() -> None:
    p = profile(gpu_class="h100-80g", gpus_per_node=4, tensor_parallel=2, pipeline_parallel=2)
    flags = pairs(
        command_line("vllm", MODEL, p.model_copy(update={"quantization": "fp8"}), ONE, cpu=False)
    )
    assert flags["--tensor-parallel-size"] == "2"
    assert flags["--pipeline-parallel-size"] == "2"
    assert flags["--quantization"] == "fp8"


def test_extra_args_follow_and_cannot_override() -> None:
    argv = command_line(
        "vllm", MODEL, profile(args=["--gpu-memory-utilization", "0.8"]), ONE, cpu=True
    )
    assert argv[-2:] == ["--gpu-memory-utilization", "0.8"]
    for bad in (
        ["--api-key", "x"],
        ["--port=9"],
        ["--served-model-name", "other"],
        ["--tensor-parallel-size", "4"],
        ["--headless"],
        ["--master-addr", "1.2.3.4"],
        ["--kv-events-config", "{}"],
        ["--distributed-executor-backend=ray"],
    ):
        with pytest.raises(ValueError, match="llmgw sets them itself"):
            command_line("vllm", MODEL, profile(args=bad), ONE, cpu=True)


def test_multi_node_mp_leader_and_worker() -> None:
    p = profile(
        gpu_class="h100-80g", gpus_per_node=8, tensor_parallel=8, pipeline_parallel=2, nodes=2
    )
    leader = command_line("vllm", MODEL, p, shard(0, "10.0.0.1"), cpu=False)
    worker = command_line("vllm", MODEL, p, shard(1, "10.0.0.2"), cpu=False)
    for argv, rank, own in ((leader, "0", "10.0.0.1"), (worker, "1", "10.0.0.2")):
        flags = pairs(argv)
        assert flags["--nnodes"] == "2"
        assert flags["--node-rank"] == rank
        assert flags["--master-addr"] == "10.0.0.1"  # the leader's, on every node
        assert flags["--master-port"] == "28001"  # the rendezvous port, not the HTTP port
        assert flags["--host"] == own
        assert flags["--tensor-parallel-size"] == "8"
        assert flags["--pipeline-parallel-size"] == "2"
        assert "--distributed-executor-backend" not in argv
    assert "--headless" not in leader
    assert "--headless" in worker
    # mp needs no sidecar: one command per node, its exit the shard's.
    assert launch_commands("vllm", MODEL, p, shard(1, "10.0.0.2"), cpu=False) == [Command(worker)]


def test_multi_node_ray_head_sidecar_then_server_and_join_alone() -> None:
    p = profile(
        gpu_class="h100-80g",
        gpus_per_node=8,
        tensor_parallel=8,
        pipeline_parallel=2,
        nodes=2,
        launch="ray",
    )
    leader = launch_commands("/e/venv/bin/vllm", MODEL, p, shard(0, "10.0.0.1"), cpu=False)
    worker = launch_commands("/e/venv/bin/vllm", MODEL, p, shard(1, "10.0.0.2"), cpu=False)

    head, serve = leader
    assert head.argv[:4] == ["/e/venv/bin/ray", "start", "--head", "--block"]
    assert pairs(head.argv)["--port"] == "28001"
    assert pairs(head.argv)["--node-ip-address"] == "10.0.0.1"
    assert pairs(head.argv)["--num-gpus"] == "8"
    assert head.wait_for is None
    assert serve.argv[:2] == ["/e/venv/bin/vllm", "serve"]
    assert pairs(serve.argv)["--distributed-executor-backend"] == "ray"
    assert "--nnodes" not in serve.argv
    assert "--headless" not in serve.argv
    assert serve.wait_for == ("10.0.0.1", 28001)  # the server starts once its head listens

    (join,) = worker  # no vLLM process on a Ray worker
    assert join.argv[:5] == ["/e/venv/bin/ray", "start", "--address", "10.0.0.1:28001", "--block"]
    assert pairs(join.argv)["--node-ip-address"] == "10.0.0.2"  # its own, never the leader's
    assert join.wait_for == ("10.0.0.1", 28001)  # waits for the head before joining

    env = engine_env("k", p, shard(1, "10.0.0.2"), cpu=False)
    assert env["RAY_ADDRESS"] == "10.0.0.1:28001"
    assert "RAY_ADDRESS" not in engine_env(
        "k", p.model_copy(update={"launch": "mp"}), shard(0, "10.0.0.1"), cpu=False
    )


def test_kv_events_publish_on_loopback_only_with_the_block_size_the_router_hashes() -> None:
    p = profile(kv_events=True)
    argv = command_line(
        "vllm", MODEL, p, ONE, cpu=False, kv_ports=(29001, 30001), kv_topic="tiny-0"
    )
    config = json.loads(pairs(argv)["--kv-events-config"])
    # Loopback, never the node's address or a wildcard: the node agent reads them and passes
    # the blocks on; nothing beyond the node reaches an engine's sockets.
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:29001",
        "replay_endpoint": "tcp://127.0.0.1:30001",
        "topic": "tiny-0",
    }
    assert pairs(argv)["--prefix-caching-hash-algo"] == "sha256_cbor"
    assert "--enable-prompt-tokens-details" in argv
    assert pairs(argv)["--block-size"] == "16"  # set, so the router knows it
    assert engine_env("k", p, cpu=False)["PYTHONHASHSEED"] == "0"
    assert "PYTHONHASHSEED" not in engine_env("k", profile(), cpu=False)
    assert "--block-size" not in command_line("vllm", MODEL, profile(), ONE, cpu=False)

    # The operator's block size wins on the command line (their args come last), and is the
    # one the router is told.
    own = profile(kv_events=True, args=["--block-size=64"])
    assert (
        command_line("vllm", MODEL, own, ONE, cpu=False, kv_ports=(1, 2))[-1] == "--block-size=64"
    )
    assert block_size(own, cpu=False) == 64
    assert block_size(profile(args=["--block-size", "48"]), cpu=True) == 48
    assert block_size(profile(), cpu=True) == 32

    # Only the leader's scheduler publishes: a headless worker gets no config.
    multi = profile(
        kv_events=True, gpu_class="h100-80g", gpus_per_node=8, tensor_parallel=16, nodes=2
    )
    worker = command_line("vllm", MODEL, multi, shard(1, "10.0.0.2"), cpu=False, kv_ports=(1, 2))
    assert "--kv-events-config" not in worker
    with pytest.raises(ValueError, match="kv_events needs"):
        command_line("vllm", MODEL, p, ONE, cpu=False)


def test_lora_modules() -> None:
    lora = [LoraAdapter(name="sql", path="/a/sql"), LoraAdapter(name="fr", path="/a/fr")]
    argv = command_line("vllm", MODEL, profile(lora=lora), ONE, cpu=False)
    i = argv.index("--enable-lora")
    assert argv[i : i + 4] == ["--enable-lora", "--lora-modules", "sql=/a/sql", "fr=/a/fr"]


def test_key_only_in_the_environment() -> None:
    argv = command_line("vllm", MODEL, profile(), ONE, cpu=True)
    env = engine_env("sekrit-key", profile(memory_mb=8192, cpu_cores=3), cpu=True)
    assert "sekrit-key" not in " ".join(argv)
    assert env["VLLM_API_KEY"] == "sekrit-key"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["OMP_NUM_THREADS"] == "3"
    assert engine_env("k", profile(memory_mb=512), cpu=True)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine_env("k", profile(), cpu=False)


def test_adapters_start_with_the_runtime_endpoints_turned_on() -> None:
    """Adapters added to the model later are loaded through /v1/load_lora_adapter, which vLLM
    serves only when started with this variable; without adapters there is no LoRA at all."""
    with_lora = profile(lora=[{"name": "sql", "path": "/a/sql"}])
    assert engine_env("k", with_lora, cpu=True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in engine_env("k", profile(), cpu=True)


def test_a_tracing_agent_points_the_leader_at_its_receiver_unless_the_profile_does() -> None:
    url = "http://collector:4318/v1/traces"
    argv = command_line("vllm", MODEL, profile(), ONE, cpu=False, traces_url=url)
    assert pairs(argv)["--otlp-traces-endpoint"] == url
    env = engine_env("k", profile(), ONE, cpu=False, traces_url=url)
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    # Not tracing: neither flag nor environment.
    plain = command_line("vllm", MODEL, profile(), ONE, cpu=False)
    assert "--otlp-traces-endpoint" not in plain
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in engine_env("k", profile(), ONE, cpu=False)
    # A worker rank serves no requests: no flag there.
    worker = command_line("vllm", MODEL, profile(), shard(1, "10.0.0.2"), cpu=False, traces_url=url)
    assert "--otlp-traces-endpoint" not in worker
    # The operator's own receiver (gRPC, say) is left as they named it.
    own = profile(args=["--otlp-traces-endpoint=grpc://tempo:4317"])
    theirs = command_line("vllm", MODEL, own, ONE, cpu=False, traces_url=url)
    assert theirs.count("--otlp-traces-endpoint") == 0
    assert "--otlp-traces-endpoint=grpc://tempo:4317" in theirs
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in engine_env(
        "k", own, ONE, cpu=False, traces_url=url
    )
