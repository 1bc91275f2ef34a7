"""Which environment a model's profile may give its engine. Pure; used twice: when a model is
defined (workflows/catalog.py refuses it, naming the variable) and by the agent just before a
process starts (it drops it again, whatever sent the profile).

A profile's env says *how* an engine runs (NCCL_DEBUG, VLLM_ATTENTION_BACKEND, OMP_...). What
it may not say is *what* runs: the dynamic loader's LD_*, PATH, Python's start-up variables,
shell start-up files, other interpreters' option variables and the libraries CUDA, NCCL and
OpenSSL can be told to load. Engines run as the agent's user (often root), so any of these in a
definition is code execution on every node that serves the model. Nor may it take over what
llmgw itself decides per shard: the GPUs placement chose, the engine key, the node's own
address and the fabric's adapters.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_WHAT_RUNS = "changes what runs rather than how"

# Exact names, with the reason.
_FORBIDDEN: dict[str, str] = {
    "PATH": f"{_WHAT_RUNS}: it picks which programs run",
    "BASH_ENV": f"{_WHAT_RUNS}: bash runs this file at start",
    "ENV": f"{_WHAT_RUNS}: sh runs this file at start",
    "SHELLOPTS": f"{_WHAT_RUNS}: shell start-up options",
    "BASHOPTS": f"{_WHAT_RUNS}: shell start-up options",
    "PS4": f"{_WHAT_RUNS}: expanded (and run) by a tracing shell",
    "PROMPT_COMMAND": f"{_WHAT_RUNS}: a shell runs it",
    "IFS": f"{_WHAT_RUNS}: changes how shells split commands",
    "PERL5OPT": f"{_WHAT_RUNS}: options (-M modules) for every perl",
    "PERL5LIB": f"{_WHAT_RUNS}: where perl loads modules from",
    "PERLLIB": f"{_WHAT_RUNS}: where perl loads modules from",
    "PERL5DB": f"{_WHAT_RUNS}: code perl runs under -d",
    "NODE_OPTIONS": f"{_WHAT_RUNS}: options (--require) for every node",
    "NODE_PATH": f"{_WHAT_RUNS}: where node loads modules from",
    "RUBYOPT": f"{_WHAT_RUNS}: options (-r) for every ruby",
    "RUBYLIB": f"{_WHAT_RUNS}: where ruby loads libraries from",
    "JAVA_TOOL_OPTIONS": f"{_WHAT_RUNS}: options (-javaagent) for every JVM",
    "_JAVA_OPTIONS": f"{_WHAT_RUNS}: options (-javaagent) for every JVM",
    "JDK_JAVA_OPTIONS": f"{_WHAT_RUNS}: options (-javaagent) for every JVM",
    "CLASSPATH": f"{_WHAT_RUNS}: where a JVM loads classes from",
    "GCONV_PATH": f"{_WHAT_RUNS}: glibc loads conversion modules from it",
    "GETCONF_DIR": f"{_WHAT_RUNS}: glibc runs helpers from it",
    "LOCPATH": f"{_WHAT_RUNS}: glibc loads locale data from it",
    "NLSPATH": f"{_WHAT_RUNS}: glibc loads message catalogs from it",
    "HOSTALIASES": f"{_WHAT_RUNS}: redirects name lookups",
    "MALLOC_TRACE": f"{_WHAT_RUNS}: makes glibc write a file of its choosing",
    "CUDA_INJECTION64_PATH": f"{_WHAT_RUNS}: CUDA loads this library into the engine",
    "CUDA_INJECTION32_PATH": f"{_WHAT_RUNS}: CUDA loads this library into the engine",
    "NVTX_INJECTION64_PATH": f"{_WHAT_RUNS}: NVTX loads this library into the engine",
    "NVTX_INJECTION32_PATH": f"{_WHAT_RUNS}: NVTX loads this library into the engine",
    "NCCL_NET_PLUGIN": f"{_WHAT_RUNS}: NCCL loads this library into the engine",
    "NCCL_TUNER_PLUGIN": f"{_WHAT_RUNS}: NCCL loads this library into the engine",
    "NCCL_PROFILER_PLUGIN": f"{_WHAT_RUNS}: NCCL loads this library into the engine",
    "NCCL_ENV_PLUGIN": f"{_WHAT_RUNS}: NCCL loads this library into the engine",
    "OPENSSL_CONF": f"{_WHAT_RUNS}: OpenSSL's config can load engines and providers",
    "OPENSSL_ENGINES": f"{_WHAT_RUNS}: OpenSSL loads engines from it",
    "OPENSSL_MODULES": f"{_WHAT_RUNS}: OpenSSL loads providers from it",
    # What llmgw decides per shard: a model-wide value would be wrong, or a way around it.
    "CUDA_VISIBLE_DEVICES": "llmgw sets it: the GPUs placement chose for the shard",
    "NVIDIA_VISIBLE_DEVICES": "llmgw sets CUDA_VISIBLE_DEVICES: the GPUs placement chose",
    "CUDA_DEVICE_ORDER": "llmgw sets it: PCI_BUS_ID, so CUDA numbers GPUs as placement does",
    "VLLM_HOST_IP": "llmgw sets it: each node's own address",
    "VLLM_API_KEY": "llmgw sets it: the engine key only the gateway holds",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "llmgw sets it with adapters: it loads new ones at runtime",
    "LLAMA_API_KEY": "llmgw sets it: the engine key only the gateway holds",
    "SGLANG_API_KEY": "llmgw sets it: the engine key only the gateway holds",
    "RAY_ADDRESS": "llmgw sets it: the replica's own Ray head",
    "PYTHONHASHSEED": "llmgw sets it: one seed, so every replica hashes prefix-cache blocks alike",
    "NCCL_SOCKET_IFNAME": "llmgw sets it per node: the interface holding the node's address",
    "GLOO_SOCKET_IFNAME": "llmgw sets it per node: the interface holding the node's address",
    "NCCL_IB_HCA": "llmgw sets it per node: exactly the chosen fabric's adapters",
    "NCCL_IB_GID_INDEX": "llmgw sets it per node: the RoCE v2 entry discovery found",
    "NCCL_IB_DISABLE": "llmgw sets it from the fabric placement chose",
    "NCCL_MNNVL_ENABLE": "llmgw sets it from the fabric placement chose",
}

# Python start-up variables that only change how it runs; every other PYTHON* is refused
# (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE, PYTHONBREAKPOINT, PYTHONWARNINGS,
# PYTHONPYCACHEPREFIX, PYTHONEXECUTABLE, ... all pick code to load).
_HARMLESS_PYTHON = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
    }
)


def forbidden_env(name: str) -> str | None:
    """Why a profile may not set `name` in its engine's environment; None when it may."""
    if not _NAME.match(name):
        return "not a valid environment variable name"
    if name in _FORBIDDEN:
        return _FORBIDDEN[name]
    if name.startswith("LD_"):
        return f"{_WHAT_RUNS}: the dynamic loader's (libraries loaded into every process)"
    if name.startswith("BASH_FUNC_"):
        return f"{_WHAT_RUNS}: a shell function every bash imports"
    if name.startswith("PYTHON") and name not in _HARMLESS_PYTHON:
        return f"{_WHAT_RUNS}: a Python start-up variable (what Python loads and runs)"
    if name.startswith("DYLD_"):
        return f"{_WHAT_RUNS}: the dynamic loader's (libraries loaded into every process)"
    return None


def allowed_env(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """`env` split into what may be given to an engine and what is dropped (name -> reason)."""
    kept: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for name, value in env.items():
        reason = forbidden_env(name)
        if reason is None:
            kept[name] = value
        else:
            dropped[name] = reason
    return kept, dropped
