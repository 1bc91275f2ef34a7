"""Every engine llmgw runs or routes to, by name: its adapter, the machinery. Adding an engine:
its module with an `Engine` adapter (engines/adapter.py), one line in ENGINES below, and its
row of facts in workflows/contracts/engine_facts.py, which the catalog, placement, the gateway
and the doctor read (tests/unit/test_engine_facts.py holds the two together)."""

from __future__ import annotations

from engines.adapter import Engine
from engines.external import External
from engines.llamacpp import LlamaCpp
from engines.sglang import SGLang
from engines.trtllm import TrtLlm
from engines.vllm import Vllm

ENGINES: dict[str, Engine] = {
    engine.name: engine for engine in (LlamaCpp(), Vllm(), SGLang(), TrtLlm(), External())
}


class UnknownEngineError(LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown engine {name!r}: llmgw knows {', '.join(sorted(ENGINES))}")


def adapter(name: str) -> Engine:
    """The adapter of engine `name`; UnknownEngineError for a name llmgw has none for."""
    found = ENGINES.get(name)
    if found is None:
        raise UnknownEngineError(name)
    return found


def find(name: str) -> Engine | None:
    """The adapter of engine `name`, or None: for callers that answer an unknown engine in
    their own words (an install status, a default metrics path)."""
    return ENGINES.get(name)


def engines() -> list[Engine]:
    return list(ENGINES.values())
