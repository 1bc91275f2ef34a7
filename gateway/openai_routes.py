"""The OpenAI-compatible surface: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.auth import ensure_model_allowed
from gateway.deps import CallerKey, State
from gateway.proxy import proxy_completion
from gateway.request_body import parse_completion_request, read_json_object

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


async def _proxy(request: Request, state: State, key: CallerKey, path: str) -> Response:
    body = await read_json_object(request, state.settings.max_body_bytes)
    parsed = parse_completion_request(body)
    ensure_model_allowed(key, parsed.model)
    return await proxy_completion(state, key, path, parsed)


@router.post("/chat/completions")
async def chat_completions(request: Request, state: State, key: CallerKey) -> Response:
    return await _proxy(request, state, key, "/v1/chat/completions")


@router.post("/completions")
async def completions(request: Request, state: State, key: CallerKey) -> Response:
    return await _proxy(request, state, key, "/v1/completions")
