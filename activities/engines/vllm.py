"""vLLM's `vllm serve`: the commands and environment for one shard of a replica. Pure.

The API key travels as VLLM_API_KEY, never `--api-key` (every user of the node can read a
command line in /proc). vLLM guards only /v1 (and /v2, /inference) with it: /metrics and
/health stay open, so the port must never be exposed beyond the node.

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

from activities.engines.commands import Command, ShardPlace, check_reserved, tcp_endpoint
from workflows.contracts import ModelSpec, Profile

API_KEY_ENV = "VLLM_API_KEY"
# The CPU attention backend refuses 16 (vLLM's GPU default); 32 and its multiples work.
CPU_BLOCK_SIZE = 32
# One seed on every engine and in the router, so prefix-cache block hashes agree (vLLM <= 0.28
# otherwise seeds them at random). sha256_cbor is the hash the router reproduces.
KV_HASH_SEED = "0"
KV_HASH_ALGO = "sha256_cbor"
# How long a Ray join (or the server on a Ray head) waits for the head to listen.
RENDEZVOUS_WAIT_S = 300.0

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


def kv_events_config(address: str, pub_port: int, replay_port: int, topic: str) -> str:
    """`--kv-events-config` JSON. Both endpoints name this node's own address, never a wildcard
    (CVE-2025-30202: a ZMQ socket bound to all interfaces): given a plain address vLLM's PUB
    socket connects to the subscriber listening there, and its replay ROUTER binds only that
    address."""
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": tcp_endpoint(address, pub_port),
            "replay_endpoint": tcp_endpoint(address, replay_port),
            "topic": topic,
        },
        separators=(",", ":"),
    )


def command_line(
    entrypoint: str,
    model: ModelSpec,
    profile: Profile,
    place: ShardPlace,
    *,
    cpu: bool,
    kv_ports: tuple[int, int] | None = None,
    kv_topic: str = "",
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
    if profile.kv_events and place.rank == 0:
        if kv_ports is None:
            raise ValueError(f"model {model.name}: kv_events needs a publisher and replay port")
        argv += [
            "--prefix-caching-hash-algo",
            KV_HASH_ALGO,
            "--kv-events-config",
            kv_events_config(place.address, kv_ports[0], kv_ports[1], kv_topic or model.name),
        ]
    if profile.lora:
        argv += ["--enable-lora", "--lora-modules"]
        argv += [f"{adapter.name}={adapter.path}" for adapter in profile.lora]
    return [*argv, *profile.args]


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
) -> list[Command]:
    """This shard's commands, sidecars first; the last one's exit is the shard's.

    `ray` is found beside `vllm` in the engine's environment."""
    serve = command_line(
        entrypoint, model, profile, place, cpu=cpu, kv_ports=kv_ports, kv_topic=kv_topic
    )
    if not (place.multi_node and profile.launch == "ray"):
        return [Command(serve)]
    ray = entrypoint[: -len("vllm")] + "ray" if entrypoint.endswith("vllm") else "ray"
    head = (place.leader, place.rendezvous_port)
    if place.rank > 0:
        return [Command(ray_join(ray, place), wait_for=head)]
    return [Command(ray_head(ray, place)), Command(serve, wait_for=head)]


def engine_env(
    key: str, profile: Profile, place: ShardPlace | None = None, *, cpu: bool
) -> dict[str, str]:
    """The key, no hub access (weights are local), and on the CPU a KV cache sized from the
    profile's memory budget: half of it, in whole GiB, at least one. Under Ray the server
    attaches to the replica's own head, not whichever cluster it finds first."""
    env = {API_KEY_ENV: key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, profile.memory_mb // 2048))
        env["OMP_NUM_THREADS"] = str(profile.cpu_cores)
    if profile.kv_events:
        env["PYTHONHASHSEED"] = KV_HASH_SEED
    if place is not None and place.multi_node and profile.launch == "ray":
        env["RAY_ADDRESS"] = f"{place.leader}:{place.rendezvous_port}"
    return env
