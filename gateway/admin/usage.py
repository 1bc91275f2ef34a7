"""GET /admin/v1/usage: requests and tokens per key, model and UTC day, as JSON or CSV."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from gateway.admin.routes import require_local
from gateway.deps import State
from gateway.errors import bad_request
from gateway.usage_export import usage_csv

router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_local)])


def csv_filename(since: date | None, until: date | None) -> str:
    # Built from dates only, so nothing a caller typed reaches the header.
    span = "-".join(d.isoformat() for d in (since, until) if d is not None)
    return f"llmgw-usage-{span}.csv" if span else "llmgw-usage.csv"


@router.get("/usage", response_model=None)
async def usage(
    state: State,
    key_id: str | None = None,
    model: str | None = None,
    since: date | None = None,  # a UTC day, YYYY-MM-DD, inclusive
    until: date | None = None,  # a UTC day, YYYY-MM-DD, inclusive
    as_format: Annotated[Literal["json", "csv"], Query(alias="format")] = "json",
) -> dict[str, Any] | Response:
    if since is not None and until is not None and since > until:
        raise bad_request("since is after until.", param="since")
    try:
        rows = await state.store.usage(key_id=key_id, model=model, since=since, until=until)
    except ValueError as err:
        raise bad_request(str(err)) from None
    if as_format == "csv":
        names = {k.key_id: k.name for k in await state.store.list_keys()}
        return Response(
            usage_csv(rows, names),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{csv_filename(since, until)}"'},
        )
    return {"data": [row.model_dump(mode="json") for row in rows]}
