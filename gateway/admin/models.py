"""Model definitions through the admin API: GET and PUT /admin/v1/models[/NAME].

A change is a command, so beyond the admin API's loopback rule it must come as
application/json (which a page cannot send cross-site without a preflight) and must not carry
the marks a browser puts on a cross-site request (Sec-Fetch-Site, an Origin from elsewhere).
A model definition decides what runs on the nodes: the seed learned that a page which rebound
its own name to 127.0.0.1 could otherwise define one.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError
from temporalio.client import WorkflowUpdateFailedError

from gateway.admin.guard import check_json_body, check_same_site
from gateway.admin.routes import require_local
from gateway.deps import State
from gateway.errors import ApiError
from gateway.route_source import ModelCatalog
from workflows.catalog import CatalogError, validate_model
from workflows.contracts import ModelSpec

router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_local)])


def require_same_site_json(request: Request) -> None:
    """For a route that takes a change: nothing a browser marks cross-site, and the body (or
    its absence) declared as application/json, whatever the method. `require_local`, on every
    admin router, already applies this to POST, PUT, PATCH and DELETE."""
    check_same_site(request.headers)
    check_json_body(request.headers)


def _catalog(state: State) -> ModelCatalog:
    source = state.routes.source
    if not isinstance(source, ModelCatalog):
        raise ApiError(501, "This gateway has no model catalog.", code="no_catalog")
    return source


@router.get("/models")
async def list_models(state: State) -> dict[str, Any]:
    views = await _catalog(state).list_models()
    return {"data": [view.model_dump(mode="json") for view in views]}


@router.put("/models/{name}", dependencies=[Depends(require_same_site_json)])
async def put_model(name: str, request: Request, state: State) -> dict[str, Any]:
    """Create the model, or replace its definition (a changed profile rolls its replicas)."""
    try:
        spec = ModelSpec.model_validate_json(await request.body())
    except ValidationError as err:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise ApiError(400, f"Invalid model: {fields}", code="invalid_model") from None
    if spec.name != name:
        raise ApiError(400, f"The body defines {spec.name!r}, not {name!r}.", code="invalid_model")
    try:
        validate_model(spec)
    except CatalogError as err:
        raise ApiError(400, f"Invalid model: {err}", code="invalid_model") from None
    try:
        view = await _catalog(state).apply_model(spec)
    except WorkflowUpdateFailedError as err:
        raise ApiError(409, f"Refused: {err.cause}", code="model_refused") from None
    return view.model_dump(mode="json")
