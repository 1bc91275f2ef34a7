"""OpenAI-shaped errors: every failure the gateway returns looks like
`{"error": {"message", "type", "param", "code"}}`, so OpenAI clients raise their usual
exceptions, and nothing internal (a stack trace, a host name) reaches a client.

An unexpected exception becomes a JSON 500 whose request id (in the message and in the
`x-request-id` header) is also on the logged traceback, so a client's report finds the trace.
The FastAPI app answers its own (`install_error_handlers`); gateway/front_door.py guards
everything else, the proxied routes included.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


def error_body(
    message: str, type_: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ApiError(Exception):
    """Raised anywhere on a request path; the handler turns it into the response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type_ = type_
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type_, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    message = str(first.get("msg", "invalid request"))
    param = ".".join(loc) or None
    return ApiError(400, f"{param}: {message}" if param else message, param=param).response()


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, str(exc.detail), code=code, headers=exc.headers).response()


REQUEST_ID_HEADER = "x-request-id"
# Set on an exception once it has been logged with its request id: Starlette re-raises after
# its handler answers, and the front door must not log the same failure a second time.
_LOGGED_AS = "_llmgw_request_id"


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def internal_error(request_id: str) -> ApiError:
    """The one answer to any unexpected failure: our fault, and nothing more about it."""
    return ApiError(
        500,
        f"The server had an error while processing your request (request id {request_id}).",
        type_=SERVER_ERROR,
        code="internal_error",
        headers={REQUEST_ID_HEADER: request_id},
    )


def log_unexpected(exc: BaseException, method: str, path: str) -> str:
    """Log `exc` with its traceback under a new request id (once: a second call for the same
    exception returns the first id without logging)."""
    logged: str | None = getattr(exc, _LOGGED_AS, None)
    if logged is not None:
        return logged
    request_id = new_request_id()
    log.error("unhandled error on %s %s [%s]", method, path, request_id, exc_info=exc)
    # An exception type without instance attributes is logged twice at worst.
    with contextlib.suppress(AttributeError):
        setattr(exc, _LOGGED_AS, request_id)
    return request_id


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Logged here with the trace; the client learns only that it was our fault, and the id.
    return internal_error(log_unexpected(exc, request.method, request.url.path)).response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
