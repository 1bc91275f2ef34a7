"""Reading and checking an OpenAI request body before anything is sent upstream."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from gateway.errors import ApiError, bad_request

# Fields some OpenAI proxies honour to send a request elsewhere or with other credentials
# (LiteLLM's api_base SSRF, CVE-2024-6587). Engines would ignore most of them, but a request
# carrying one is either confused or probing: refuse it outright.
REDIRECTING_FIELDS = frozenset(
    {"api_base", "base_url", "api_key", "headers", "extra_headers", "api_version"}
)


@dataclass(frozen=True)
class CompletionRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    # Whether the client itself asked for the usage chunk (stream_options.include_usage).
    wants_usage: bool


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_bytes:
            raise _too_large(max_bytes)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request(
            "We could not parse the JSON body of your request.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than {max_bytes} bytes.", code="request_too_large"
    )


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    redirecting = sorted(REDIRECTING_FIELDS & body.keys())
    if redirecting:
        raise bad_request(
            f"The field '{redirecting[0]}' is not accepted: the gateway chooses where requests go.",
            param=redirecting[0],
            code="unsupported_field",
        )
    model = body.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string.", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")
    wants_usage = False
    if options:
        include = options.get("include_usage", False)
        if not isinstance(include, bool):
            raise bad_request(
                "'stream_options.include_usage' must be a boolean.",
                param="stream_options.include_usage",
            )
        wants_usage = include
    return CompletionRequest(body=body, model=model, stream=stream, wants_usage=wants_usage)
