"""The OpenAI surface FastAPI serves: /v1/models. The proxied routes (chat, completions,
embeddings) take the hot path in gateway/proxy.py instead."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.deps import CallerKey, State

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(state: State, key: CallerKey) -> dict[str, Any]:
    snapshot = state.routes.snapshot
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": 0,
                "owned_by": "llmgw",
                "ready_replicas": len(snapshot.ready(model)),
            }
            for model in snapshot.models()
            if key.allows_model(model)
        ],
    }
