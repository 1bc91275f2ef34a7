"""Is a model definition something llmgw can run? Pure checks with errors that name the field.
What each engine can do is its row's to say (workflows/contracts/engine_facts.py).

Run where a definition enters (the model workflow's `apply` validator, so the CLI, a YAML file
and the admin API all get the same answer) and never trusted later: placement checks hardware
again against what each node really has, and the agent drops forbidden environment again.
"""

from urllib.parse import urlsplit

from workflows.arg_secrets import args_problems
from workflows.artifact_names import BadArtifact, check_digest, check_relative_path
from workflows.contracts import (
    EngineFacts,
    LoraAdapter,
    ModelSpec,
    Profile,
    engine_facts,
    engine_names,
    engines_where,
)

# "external": an OpenAI-compatible server llmgw does not run; each of its URLs is a replica.
from workflows.contracts.engine_facts import EXTERNAL as EXTERNAL
from workflows.env_policy import forbidden_env
from workflows.env_secrets import env_value_problem
from workflows.external_kv import external_kv_problems

MAX_EXTERNAL_URLS = 64
MAX_UPSTREAM_MODEL_CHARS = 256
# What an external profile must leave alone: nothing is placed or launched for it. The
# context size and parallelism may stay, as a description of the server.
_EXTERNAL_UNUSED = (
    "engine_version",
    "gpu_class",
    "gpus_per_node",
    "tensor_parallel",
    "pipeline_parallel",
    "nodes",
    "cpu_cores",
    "memory_mb",
    "quantization",
    "args",
    "env",
    "kv_events",
    "lora",
    "launch",
)
# GPU families with compute capability below 8.9, where fp8 weights have no native support and
# an engine falls back to a slower path or fails. Placement checks each node's real figure too.
PRE_FP8_FAMILIES = ("a100", "a800", "a10", "a16", "a2", "a30", "a40", "a6000", "v100", "t4", "p100")


class CatalogError(ValueError):
    """Every problem with a definition, one per line, each naming its field."""

    def __init__(self, model: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"model {model}: " + "; ".join(problems))


def check_model(spec: ModelSpec) -> list[str]:
    if any(p.engine == EXTERNAL for p in spec.profiles):
        return _external_model(spec)
    problems: list[str] = _artifact_problems(spec) if spec.artifact else []
    if spec.artifact_size and not spec.artifact:
        problems.append("artifact_size: only with an artifact (the size of its files)")
    if not spec.weights and not spec.artifact:
        problems.append(f"weights: engine {spec.engine} needs a GGUF file or model directory")
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


def _artifact_problems(spec: ModelSpec) -> list[str]:
    problems = []
    try:
        check_digest(spec.artifact)
    except BadArtifact as err:
        problems.append(f"artifact: {err}")
    if spec.weights:
        try:
            check_relative_path(spec.weights)
        except BadArtifact:
            problems.append(
                f"weights: with an artifact, a path inside it (like model.gguf), "
                f"not {spec.weights[:200]!r}"
            )
    return problems


def _adapter_problems(adapter: LoraAdapter) -> list[str]:
    if not adapter.artifact:
        return []
    try:
        check_digest(adapter.artifact)
        if adapter.path:
            check_relative_path(adapter.path)
    except BadArtifact as err:
        return [str(err)]
    return []


def validate_model(spec: ModelSpec) -> None:
    problems = check_model(spec)
    if problems:
        raise CatalogError(spec.name, problems)


def check_profile(p: Profile) -> list[str]:
    """Problems as "field: why"."""
    facts = engine_facts(p.engine)
    if facts is None:
        return [f"engine: {p.engine!r} is not one of {', '.join(engine_names())}"]
    if p.engine == EXTERNAL:
        return _external_profile(p)
    problems = _hardware(p, facts) + _engine_features(p, facts)
    if p.urls:
        problems.append(f"urls: only engine {EXTERNAL} takes URLs; {p.engine} runs on the nodes")
    if p.upstream_model:
        problems.append(
            f"upstream_model: only engine {EXTERNAL} takes one; {p.engine} serves the model "
            "under its llmgw name"
        )
    if p.external_kv is not None:
        problems.append(
            f"external_kv: only engine {EXTERNAL} takes it; a {p.engine} replica llmgw runs "
            "publishes its KV events with kv_events"
        )
    for name in sorted(p.env):
        reason = forbidden_env(name) or env_value_problem(name, p.env[name])
        if reason is not None:
            problems.append(f"env.{name}: {reason}")
    problems.extend(args_problems(p.args))
    return problems


def _hardware(p: Profile, facts: EngineFacts) -> list[str]:
    if p.gpu_class is None:
        return _cpu(p, facts)
    problems = []
    if p.gpus_per_node < 1:
        problems.append(f"gpus_per_node: a profile on {p.gpu_class} needs at least 1")
    elif facts.parallelism and p.tensor_parallel * p.pipeline_parallel != p.gpus:
        problems.append(
            f"tensor_parallel x pipeline_parallel: {p.tensor_parallel} x {p.pipeline_parallel} "
            f"must equal gpus_per_node x nodes = {p.gpus_per_node} x {p.nodes}"
        )
    if "-mig-" in p.gpu_class and (p.gpus > 1 or p.tensor_parallel > 1 or p.pipeline_parallel > 1):
        problems.append(
            f"gpu_class: {p.gpu_class} is a MIG instance; a replica runs on exactly one "
            "(one process opens one MIG device and instances share no NVLink)"
        )
    if not facts.multi_node and p.nodes > 1:
        problems.append(f"nodes: {p.engine} replicas run on one node")
    if not facts.parallelism and p.tensor_parallel > 1:
        problems.append(f"tensor_parallel: {facts.title} splits layers itself; leave it at 1")
    family = p.gpu_class.split("-", 1)[0]
    if p.quantization.lower() == "fp8" and family in PRE_FP8_FAMILIES:
        problems.append(
            f"quantization: fp8 needs compute capability 8.9 or later; {p.gpu_class} has less "
            "(it would fall back to a slower path, or fail)"
        )
    return problems


def _cpu(p: Profile, facts: EngineFacts) -> list[str]:
    problems = []
    if not facts.cpu_profiles:
        on_cpu = _titles(engines_where(lambda row: row.cpu_profiles))
        problems.append(f"gpu_class: {p.engine} needs a GPU class; only {on_cpu} run without one")
    if "memory_mb" not in p.model_fields_set:
        problems.append("memory_mb: a CPU profile must declare the memory it needs")
    if p.gpus_per_node:
        problems.append("gpus_per_node: set gpu_class too, or leave it at 0 for the CPU")
    if p.nodes > 1 or p.tensor_parallel > 1 or p.pipeline_parallel > 1:
        problems.append(
            "nodes: CPU replicas run on one node, without tensor or pipeline parallelism"
        )
    return problems


def _engine_features(p: Profile, facts: EngineFacts) -> list[str]:
    problems = []
    if p.kv_events and not facts.kv_events:
        problems.append(f"kv_events: {p.engine} does not publish KV-cache events")
    if p.lora and not facts.lora:
        problems.append(f"lora: {p.engine} adapters are not supported")
    for adapter in p.lora:
        problems.extend(f"lora {adapter.name}: {why}" for why in _adapter_problems(adapter))
    names = [adapter.name for adapter in p.lora]
    if len(set(names)) != len(names):
        problems.append("lora: adapter names must be unique")
    if p.launch == "ray" and (not facts.ray_launch or p.nodes < 2):
        on_ray = _titles(engines_where(lambda row: row.ray_launch))
        problems.append(f"launch: ray is for multi-node {on_ray} replicas")
    return problems


def _titles(names: tuple[str, ...]) -> str:
    """ "llama.cpp and vLLM": the engines' titles, for a message."""
    titles = [row.title for row in map(engine_facts, names) if row is not None]
    return " and ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 1 else titles)


def _external_model(spec: ModelSpec) -> list[str]:
    """min/max_replicas are not checked: an external model's replicas are its URLs."""
    problems = []
    if len(spec.profiles) != 1:
        problems.append(
            f"profiles: an {EXTERNAL} model has exactly one profile (its URLs), "
            f"not {len(spec.profiles)}"
        )
    if spec.autoscale is not None:
        problems.append(f"autoscale: llmgw does not scale {EXTERNAL} endpoints")
    for i, profile in enumerate(spec.profiles):
        problems.extend(f"profiles[{i}].{p}" for p in check_profile(profile))
    return problems


def _external_profile(p: Profile) -> list[str]:
    problems = []
    for field in _EXTERNAL_UNUSED:
        default = Profile.model_fields[field].get_default(call_default_factory=True)
        if getattr(p, field) != default:
            problems.append(f"{field}: {EXTERNAL} endpoints run elsewhere; leave it unset")
    if not 1 <= len(p.urls) <= MAX_EXTERNAL_URLS:
        problems.append(
            f"urls: an {EXTERNAL} model needs 1 to {MAX_EXTERNAL_URLS}, not {len(p.urls)}"
        )
    for i, url in enumerate(p.urls):
        problems.extend(f"urls[{i}]: {why}" for why in url_problems(url))
    bases = [endpoint_base(url) for url in p.urls]
    if len(set(bases)) != len(bases):
        problems.append("urls: the same endpoint is listed twice")
    problems.extend(f"upstream_model: {why}" for why in upstream_model_problems(p.upstream_model))
    problems.extend(external_kv_problems(p))
    return problems


def upstream_model_problems(name: str) -> list[str]:
    """Why an upstream model name is refused: [] for "" (none) or a plain name. Hosted APIs use
    names such as "gpt-4o-mini", "meta-llama/Llama-3.1-8B-Instruct" or "org/model:tag"."""
    if len(name) > MAX_UPSTREAM_MODEL_CHARS:
        return [f"at most {MAX_UPSTREAM_MODEL_CHARS} characters, not {len(name)}"]
    if name != name.strip() or any(c.isspace() or not c.isprintable() for c in name):
        return [f"{name!r} has spaces or control characters"]
    return []


def url_problems(url: str) -> list[str]:
    """Why an external endpoint's URL is refused: [] when it is an http(s) base URL."""
    authority = url.partition("//")[2].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in authority:
        # Credentials in a URL would land in workflow history and the routing table; the
        # message does not repeat the URL, which holds them.
        return [
            "credentials do not go in the URL; give the key with --upstream-key-file or "
            "--upstream-key-env"
        ]
    if url != url.strip() or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        return [f"{url!r} has spaces or control characters"]
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        return [f"{url!r} is not a URL ({err})"]
    if parts.scheme not in ("http", "https"):
        return [f"{url!r} must start with http:// or https://"]
    problems = []
    if not parts.hostname:
        problems.append(f"{url!r} names no host")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        problems.append(f"{url!r} must have no query or fragment")
    if port == 0:
        problems.append(f"{url!r} has port 0")
    return problems


def endpoint_base(url: str) -> str:
    """The URL the gateway puts /v1/... after: no trailing slash, no trailing /v1."""
    return url.rstrip("/").removesuffix("/v1").rstrip("/")
