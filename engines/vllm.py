"""vLLM's `vllm serve`: the commands and environment for one shard of a replica (pure), and the
engine's adapter, which installs it as a Python environment (python_env.py).

The API key travels as VLLM_API_KEY, never `--api-key` (every user of the node can read a
command line in /proc). vLLM guards only /v1 (and /v2, /inference) with it: /metrics and
/health stay open, so the port must never be exposed beyond the node.

A profile with LoRA adapters starts them with `--enable-lora --lora-modules NAME=PATH ...` and
with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, which adds /v1/load_lora_adapter and
/v1/unload_lora_adapter (under the key, like all of /v1): the agent loads adapters added to the
model later, and unloads those removed, without a restart. The gateway never forwards those
paths (it proxies only the completion and embedding endpoints). How many adapters one batch
mixes and their largest rank stay vLLM's defaults (--max-loras 1, --max-lora-rank 16) unless
the profile's args say otherwise: an adapter of a higher rank is refused when it is loaded.

Multi-node, as vLLM documents it:
- "mp" (vLLM's own multi-process executor): every node runs `vllm serve` with `--nnodes N
  --node-rank R --master-addr LEADER --master-port P`; the workers (rank > 0) add `--headless`
  and serve no HTTP.
- "ray": the leader runs a Ray head (a sidecar) and then `vllm serve ...
  --distributed-executor-backend ray` against it; a worker runs only the Ray join, and no vLLM
  process at all. The join waits for the head to listen before it starts.
"""

from __future__ import annotations

import json

from engines.adapter import KvPublisher, RuntimeAdapters, ShardLaunch
from engines.commands import Command, ShardPlace, check_reserved, tcp_endpoint
from engines.python_env import PythonEnvEngine
from workflows.contracts import ModelSpec, Profile
from workflows.engine_plan import VLLM
from workflows.placement.ports import KV_PUB, KV_REPLAY

API_KEY_ENV = "VLLM_API_KEY"
# vLLM reads it as "1" or "true", any case (vllm/envs.py).
RUNTIME_LORA = RuntimeAdapters(
    load="/v1/load_lora_adapter",
    unload="/v1/unload_lora_adapter",
    listing="/v1/models",
    enable_env=("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"),
)
# The CPU attention backend refuses 16 (vLLM's GPU default); 32 and its multiples work.
CPU_BLOCK_SIZE = 32
# Set explicitly with KV events, so the router hashes blocks of the size the engine caches
# (some GPU attention backends would otherwise pick their own).
GPU_BLOCK_SIZE = 16
# One seed on every engine, so their prefix-cache block hashes agree with each other (vLLM <= 0.28
# otherwise seeds them at random), and sha256_cbor, the hash the gateway reproduces from token
# ids (kv/hashes.py) to look up the blocks the engines report.
KV_HASH_SEED = "0"
LOOPBACK = "127.0.0.1"
KV_HASH_ALGO = "sha256_cbor"
# Where vLLM sends its own spans (its request spans take the gateway's traceparent as parent).
TRACES_FLAG = "--otlp-traces-endpoint"

RESERVED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--model",
        "--max-model-len",
        "--max-num-seqs",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--headless",
        "--distributed-executor-backend",
        "--kv-events-config",
        "--prefix-caching-hash-algo",
        "--enable-lora",
        "--lora-modules",
        "--quantization",
        "-q",
    }
)


def kv_events_config(pub_port: int, replay_port: int, topic: str) -> str:
    """`--kv-events-config` JSON. Both endpoints are on loopback, never a wildcard or the
    node's address (CVE-2025-30202: a ZMQ socket bound to all interfaces): given a plain
    address vLLM's PUB socket connects to the node agent's subscriber listening there, and its
    replay ROUTER binds only loopback. The agent passes the events on (kv/feed.py)."""
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": tcp_endpoint(LOOPBACK, pub_port),
            "replay_endpoint": tcp_endpoint(LOOPBACK, replay_port),
            "topic": topic,
        },
        separators=(",", ":"),
    )


def block_size(profile: Profile, *, cpu: bool) -> int:
    """The engine's block size: the operator's `--block-size` among the profile's args (they
    come last on the command line, so theirs wins), else the one llmgw sets."""
    args = list(profile.args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--block-size" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--block-size="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return CPU_BLOCK_SIZE if cpu else GPU_BLOCK_SIZE


def command_line(
    entrypoint: str,
    model: ModelSpec,
    profile: Profile,
    place: ShardPlace,
    *,
    cpu: bool,
    kv_ports: tuple[int, int] | None = None,
    kv_topic: str = "",
    traces_url: str = "",
) -> list[str]:
    """argv for this shard's `vllm serve` of the model directory `model.weights`.

    On the CPU: `--block-size 32` (16 is refused there) and `--enforce-eager` (graph capture
    is a GPU feature that only costs start-up time on the CPU). `kv_ports` (publisher,
    replay) are used when the profile asks for KV-cache events, on the leader only (the
    scheduler publishing them runs there)."""
    check_reserved(model.name, profile.args, RESERVED_FLAGS)
    argv = [
        entrypoint,
        "serve",
        model.weights,
        "--host",
        place.address,
        "--port",
        str(place.port),
        # Responses and /v1/models name the model as clients asked for it, not by directory.
        "--served-model-name",
        model.name,
        "--max-model-len",
        str(profile.context_size),
        "--max-num-seqs",
        str(profile.parallel),
        "--enable-prefix-caching",
    ]
    if profile.tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(profile.tensor_parallel)]
    if profile.pipeline_parallel > 1:
        argv += ["--pipeline-parallel-size", str(profile.pipeline_parallel)]
    if profile.quantization:
        argv += ["--quantization", profile.quantization]
    if place.multi_node:
        if profile.launch == "ray":
            argv += ["--distributed-executor-backend", "ray"]
        else:
            argv += [
                "--nnodes",
                str(place.nodes),
                "--node-rank",
                str(place.rank),
                "--master-addr",
                place.leader,
                "--master-port",
                str(place.rendezvous_port),
            ]
            if place.rank > 0:
                argv.append("--headless")
    if cpu:
        argv += ["--block-size", str(CPU_BLOCK_SIZE), "--enforce-eager"]
    elif profile.kv_events:
        argv += ["--block-size", str(GPU_BLOCK_SIZE)]
    if profile.kv_events and place.rank == 0:
        if kv_ports is None:
            raise ValueError(f"model {model.name}: kv_events needs a publisher and replay port")
        argv += [
            # The cached tokens in each answer's usage: what the gateway compares its
            # prediction with (llmgw_kv_predicted_cached_tokens_error).
            "--enable-prompt-tokens-details",
            "--prefix-caching-hash-algo",
            KV_HASH_ALGO,
            "--kv-events-config",
            kv_events_config(kv_ports[0], kv_ports[1], kv_topic or model.name),
        ]
    if profile.lora:
        argv += ["--enable-lora", "--lora-modules"]
        argv += [f"{adapter.name}={adapter.path}" for adapter in profile.lora]
    if traces_to(traces_url, profile) and place.rank == 0:
        # Its request spans, under the gateway's attempt span (the traceparent it is sent).
        argv += [TRACES_FLAG, traces_url]
    return [*argv, *profile.args]


def traces_to(traces_url: str, profile: Profile) -> bool:
    """Whether llmgw points the engine at the agent's trace receiver: when the agent traces,
    unless the profile's own args name a receiver of the operator's."""
    return bool(traces_url) and not any(
        arg == TRACES_FLAG or arg.startswith(TRACES_FLAG + "=") for arg in profile.args
    )


def ray_head(ray: str, place: ShardPlace) -> list[str]:
    """The leader's Ray head, in the foreground (`--block`) so it lives and dies with the
    shard's process group rather than as a daemon nobody stops."""
    return [
        ray,
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        place.address,
        "--port",
        str(place.rendezvous_port),
        "--num-gpus",
        str(len(place.gpus)),
        *(["--num-cpus", str(place.cpu_cores)] if place.cpu_cores else []),
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]


def ray_join(ray: str, place: ShardPlace) -> list[str]:
    """A worker's Ray join of the leader's head, in the foreground."""
    return [
        ray,
        "start",
        "--address",
        f"{place.leader}:{place.rendezvous_port}",
        "--block",
        "--node-ip-address",
        place.address,
        "--num-gpus",
        str(len(place.gpus)),
        *(["--num-cpus", str(place.cpu_cores)] if place.cpu_cores else []),
        "--disable-usage-stats",
    ]


def launch_commands(
    entrypoint: str,
    model: ModelSpec,
    profile: Profile,
    place: ShardPlace,
    *,
    cpu: bool,
    kv_ports: tuple[int, int] | None = None,
    kv_topic: str = "",
    traces_url: str = "",
) -> list[Command]:
    """This shard's commands, sidecars first; the last one's exit is the shard's.

    `ray` is found beside `vllm` in the engine's environment."""
    serve = command_line(
        entrypoint,
        model,
        profile,
        place,
        cpu=cpu,
        kv_ports=kv_ports,
        kv_topic=kv_topic,
        traces_url=traces_url,
    )
    if not (place.multi_node and profile.launch == "ray"):
        return [Command(serve)]
    ray = entrypoint[: -len("vllm")] + "ray" if entrypoint.endswith("vllm") else "ray"
    head = (place.leader, place.rendezvous_port)
    if place.rank > 0:
        return [Command(ray_join(ray, place), wait_for=head)]
    return [Command(ray_head(ray, place)), Command(serve, wait_for=head)]


def engine_env(
    key: str,
    profile: Profile,
    place: ShardPlace | None = None,
    *,
    cpu: bool,
    traces_url: str = "",
) -> dict[str, str]:
    """The key, no hub access (weights are local), runtime LoRA loading with adapters, and on
    the CPU a KV cache sized from the profile's memory budget: half of it, in whole GiB, at
    least one. VLLM_HOST_IP is this
    node's own address (never the leader's), on every node. Under Ray the server attaches to
    the replica's own head, not whichever cluster it finds first."""
    env = {API_KEY_ENV: key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if place is not None:
        env["VLLM_HOST_IP"] = place.address
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, profile.memory_mb // 2048))
        env["OMP_NUM_THREADS"] = str(profile.cpu_cores)
    if profile.kv_events:
        env["PYTHONHASHSEED"] = KV_HASH_SEED
    if profile.lora:
        name, value = RUNTIME_LORA.enable_env
        env[name] = value
    if place is not None and place.multi_node and profile.launch == "ray":
        env["RAY_ADDRESS"] = f"{place.leader}:{place.rendezvous_port}"
    if traces_to(traces_url, profile):
        # The receiver speaks OTLP/HTTP (workflows/otel.py); vLLM's exporter defaults to gRPC.
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        env["OTEL_SERVICE_NAME"] = "vllm"
    return env


class Vllm(PythonEnvEngine):
    name = VLLM
    runtime_adapters = RUNTIME_LORA

    def commands(self, shard: ShardLaunch) -> list[Command]:
        ports = shard.ports
        kv_ports = (
            (ports[KV_PUB], ports[KV_REPLAY]) if KV_PUB in ports and KV_REPLAY in ports else None
        )
        return launch_commands(
            str(shard.binary),
            shard.model,
            shard.profile,
            shard.place,
            cpu=_on_cpu(shard),
            kv_ports=kv_ports,
            kv_topic=shard.replica_id,
            traces_url=shard.traces_url,
        )

    def environment(self, shard: ShardLaunch) -> dict[str, str]:
        return engine_env(
            shard.key, shard.profile, shard.place, cpu=_on_cpu(shard), traces_url=shard.traces_url
        )

    def kv_publisher(self, shard: ShardLaunch) -> KvPublisher | None:
        """The leader's publisher, when the profile asks for events (the scheduler publishing
        them runs on the leader)."""
        ports = shard.ports
        if not shard.profile.kv_events or shard.place.rank != 0:
            return None
        if KV_PUB not in ports or KV_REPLAY not in ports:
            return None
        return KvPublisher(
            endpoint=tcp_endpoint(LOOPBACK, ports[KV_PUB]),
            replay_endpoint=tcp_endpoint(LOOPBACK, ports[KV_REPLAY]),
            topic=shard.replica_id,
            block_size=block_size(shard.profile, cpu=_on_cpu(shard)),
            hash_seed=KV_HASH_SEED,
            adapters=tuple((adapter.name, adapter.path) for adapter in shard.profile.lora),
        )


def _on_cpu(shard: ShardLaunch) -> bool:
    """A profile without a GPU class, or a node without an NVIDIA driver, runs vLLM's CPU build."""
    return shard.profile.gpu_class is None or not shard.nvidia
