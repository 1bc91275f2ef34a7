"""What the gateway process remembers of its requests (gateway/observe/): the request log, GET
/admin/v1/requests with filters, and the charts' series, GET /admin/v1/series for one model, one
key, or everything. Both 404 `request_log_off` when settings.request_log_size is 0.

Each process of a `--workers N` gateway answers with its own requests only.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query

from gateway.admin.routes import require_local
from gateway.deps import State
from gateway.errors import ApiError, bad_request
from gateway.observe.request_log import BadFilter, RequestFilter, RequestLog
from gateway.observe.series import BUCKET_S, BUCKETS

router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_local)])
# The most records one answer carries (the log may hold many more).
MAX_LIMIT = 1000


def _log(state: State) -> RequestLog:
    if state.request_log is None:
        raise ApiError(
            404,
            "This gateway keeps no request log (request_log_size is 0).",
            code="request_log_off",
        )
    return state.request_log


@router.get("/requests")
async def requests(
    state: State,
    model: str | None = None,
    key: str | None = None,  # a key's id or name
    status: str | None = None,  # a status class: 2xx, 3xx, 4xx or 5xx
    replica: str | None = None,
    min_ttft_ms: float | None = None,
    request_id: str | None = None,
    limit: int = Query(default=100, ge=1, le=MAX_LIMIT),
) -> dict[str, Any]:
    """The newest requests that match every filter given, newest first."""
    log = _log(state)
    try:
        wanted = RequestFilter(
            model=model or None,
            key=key or None,
            status_class=status or None,
            replica=replica or None,
            min_ttft_s=None if min_ttft_ms is None else min_ttft_ms / 1000,
            request_id=request_id or None,
        )
    except BadFilter as err:
        raise bad_request(str(err), code="invalid_filter") from None
    models, keys, replicas = log.seen()
    return {
        "size": log.size,
        "held": len(log),
        "data": [record.as_dict() for record in log.query(wanted, limit)],
        # What the filters can pick from: what the log holds now.
        "models": models,
        "keys": keys,
        "replicas": replicas,
    }


@router.get("/series")
async def series(
    state: State,
    model: str | None = None,
    key: str | None = None,  # a key's name
    minutes: int = Query(default=BUCKETS * BUCKET_S // 60, ge=1, le=BUCKETS * BUCKET_S // 60),
) -> dict[str, Any]:
    """One series' figures per BUCKET_S bucket over the last `minutes`: everything's, or one
    model's or key's; and the models and keys that have one."""
    book = _log(state).series
    if model and key:
        raise bad_request("Ask for a model's series or a key's, not both.", code="invalid_filter")
    read = book.read(model or None, key or None, minutes * 60 // BUCKET_S)
    if read is None:
        which = f"model {model!r}" if model else f"key {key!r}"
        raise ApiError(404, f"No requests of the {which} in the last hour.", code="no_series")
    return {
        "bucket_s": BUCKET_S,
        "model": model or None,
        "key": key or None,
        "series": read,
        "models": sorted(book.models),
        "keys": sorted(book.keys),
    }
