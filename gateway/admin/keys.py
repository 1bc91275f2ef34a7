"""Keys through the admin API: client API keys (list, create, revoke, change limits), and the
key the gateway sends an external model's endpoints (set, delete; never read back).

Reads answer to local clients; changes must also come as same-site JSON (see
admin_models.require_same_site_json). A key's hash never leaves the store, and its plaintext
leaves it once, in the answer to the POST that created it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.admin.models import require_same_site_json
from gateway.admin.routes import require_local
from gateway.deps import State
from gateway.errors import ApiError, bad_request
from store import ApiKey, KeyLimits, KeyNameTaken

router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_local)])
_writes = [Depends(require_same_site_json)]
T = TypeVar("T", bound=BaseModel)


class CreateKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    models: list[str] | None = None
    adapters: list[str] | None = None
    limits: KeyLimits = Field(default_factory=KeyLimits)
    expires_at: datetime | None = None  # naive means UTC
    # Also opens the remote web console; see ApiKey.admin.
    admin: bool = False


class UpstreamKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str


def key_view(key: ApiKey) -> dict[str, Any]:
    return key.model_dump(mode="json", exclude={"key_hash"})


async def parse_body(request: Request, model: type[T]) -> T:
    # Parsed here rather than as a FastAPI body parameter, so the same-site check has run first
    # and errors keep the admin API's shape.
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as err:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors()
        )
        raise bad_request(f"Invalid request: {fields}", code="invalid_request") from None


def _no_key(name_or_id: str) -> ApiError:
    return ApiError(404, f"No active API key {name_or_id!r}.", code="key_not_found")


@router.get("/keys")
async def list_keys(state: State) -> dict[str, Any]:
    return {"data": [key_view(key) for key in await state.store.list_keys()]}


@router.post("/keys", dependencies=_writes, response_model=None)
async def create_key(request: Request, state: State) -> JSONResponse:
    body = await parse_body(request, CreateKeyRequest)
    try:
        record, plaintext = await state.store.create_key(
            body.name,
            models=body.models,
            expires_at=body.expires_at,
            adapters=body.adapters,
            limits=body.limits,
            admin=body.admin,
        )
    except KeyNameTaken as err:
        raise ApiError(409, str(err), code="key_name_taken") from None
    except ValueError as err:
        raise bad_request(str(err), code="invalid_request") from None
    await applied_here(state)
    return JSONResponse(
        {"key": key_view(record), "api_key": plaintext},
        status_code=201,
        # The only time the plaintext exists outside the caller: keep it out of every cache.
        headers={"Cache-Control": "no-store"},
    )


@router.delete("/keys/{name_or_id}", dependencies=_writes)
async def revoke_key(name_or_id: str, state: State) -> dict[str, Any]:
    if not await state.store.revoke_key(name_or_id):
        raise _no_key(name_or_id)
    await applied_here(state)
    return {"revoked": name_or_id}


@router.put("/keys/{name_or_id}/limits", dependencies=_writes)
async def set_limits(name_or_id: str, request: Request, state: State) -> dict[str, Any]:
    limits = await parse_body(request, KeyLimits)
    record = await state.store.set_key_limits(name_or_id, limits)
    if record is None:
        raise _no_key(name_or_id)
    await applied_here(state)
    return key_view(record)


async def applied_here(state: State) -> None:
    """This gateway takes a key change at once, rather than at its next background refresh:
    a key created here works on the next request, and one revoked here stops working.
    Other gateways (and other workers of this one) take it at their next refresh."""
    await state.keys.refresh()


# --- an external model's upstream key --------------------------------------------------------


@router.put("/models/{model}/upstream-key", dependencies=_writes)
async def set_upstream_key(model: str, request: Request, state: State) -> dict[str, Any]:
    """Keep the key for `model`'s external endpoints. It may come before the model is defined,
    as `llmgw model add` does it, so the routes never reach a gateway ahead of their key."""
    body = await parse_body(request, UpstreamKeyRequest)
    try:
        await state.store.set_upstream_key(model, body.key)
    except ValueError as err:  # the message never quotes the key
        raise bad_request(str(err), code="invalid_request") from None
    # This gateway uses it at once; the others at their next key refresh.
    state.upstream_keys = {**state.upstream_keys, model: body.key}
    return {"model": model, "upstream_key": "set"}


@router.delete("/models/{model}/upstream-key", dependencies=_writes)
async def delete_upstream_key(model: str, state: State) -> dict[str, Any]:
    if model not in await state.store.upstream_keys():
        raise ApiError(404, f"No upstream key for {model!r}.", code="upstream_key_not_found")
    await state.store.set_upstream_key(model, None)
    state.upstream_keys = {k: v for k, v in state.upstream_keys.items() if k != model}
    return {"model": model, "upstream_key": "deleted"}
