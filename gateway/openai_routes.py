"""The OpenAI surface FastAPI serves: /v1/models. The proxied routes (chat, completions,
embeddings) take the hot path in gateway/proxy.py instead."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.deps import CallerKey, State
from gateway.routing import RoutingSnapshot
from store import ApiKey

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(state: State, key: CallerKey) -> dict[str, Any]:
    return {"object": "list", "data": model_entries(state.routes.snapshot, key)}


def model_entries(snapshot: RoutingSnapshot, key: ApiKey) -> list[dict[str, Any]]:
    """Each model the key may use, then each LoRA adapter its replicas load that the key may
    use, as `<model>:<adapter>` (the name a request gives it)."""
    entries: list[dict[str, Any]] = []
    for model in snapshot.models():
        if not key.allows_model(model):
            continue
        ready = snapshot.ready(model)
        entries.append(_entry(model, len(ready)))
        adapters = dict.fromkeys(a for r in snapshot.routes(model) for a in r.adapters)
        for adapter in adapters:
            if key.allows_adapter(adapter):
                serving = sum(adapter in r.adapters for r in ready)
                entries.append(_entry(f"{model}:{adapter}", serving))
    return entries


def _entry(model_id: str, ready_replicas: int) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": 0,
        "owned_by": "llmgw",
        "ready_replicas": ready_replicas,
    }
