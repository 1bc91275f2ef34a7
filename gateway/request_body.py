"""Checking an OpenAI request body before anything is sent upstream.

Everything here is pure: the body arrives as bytes, leaves as a `ProxiedRequest` or an ApiError
naming the field at fault. Only the fields the gateway must understand are checked; the rest
pass through to the engine untouched (tools, response_format and the like).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.body_fields import (
    ADAPTER_SELECTING_FIELDS,
    ALLOWED_MEDIA_SCHEMES,
    CODE_FIELDS,
    ENGINE_RANGES,
    MEDIA_PARTS,
    MEDIA_URL_NAMES,
    NUMERIC_RANGES,
    REDIRECTING_FIELDS,
    UNCOUNTED_PROMPT_FIELDS,
)
from gateway.errors import ApiError, bad_request
from gateway.json_body import parse_json_object

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
PROXIED_PATHS = (CHAT, COMPLETIONS, EMBEDDINGS)
# The body fields that shape a chat or completion prompt's tokens: what gateway/tokenize.py
# sends an engine's /tokenize, and what gateway/body_parse.py serialises first in a split body.
PROMPT_FIELDS = ("messages", "prompt", "tools", "chat_template", "chat_template_kwargs")

MAX_MODEL_NAME = 256
# vLLM's per-request prefix-cache salt: it takes a string of 1 to 1,024 characters, or null.
# Checked for every key, so a salt the gateway rewrites (gateway/cache_salt.py) is a string.
CACHE_SALT = "cache_salt"
MAX_CACHE_SALT = 1024


@dataclass(frozen=True)
class ProxiedRequest:
    path: str
    body: dict[str, Any]
    # The catalog model whose replicas serve it, and the LoRA adapter when the client named
    # one as `model: "<model>:<adapter>"`.
    model: str
    adapter: str | None
    stream: bool
    # Whether the client itself asked for the usage chunk (stream_options.include_usage).
    wants_usage: bool
    # The `user` field, for session affinity when no session header is sent.
    user: str | None
    # Filled in when the body was parsed by gateway/body_parse.py, which does all of a body's
    # O(size) work in one place (off the event loop for large bodies):
    # the prompt's upper-bound estimate (gateway/prompt_estimate.py),
    prompt_estimate: int | None = None
    # the prompt's leading bytes for prefix routing (gateway/routing/request_key.py),
    routing_prompt: bytes | None = None
    # and, for a large body, its bulky fields (messages, prompt, tools...) serialised as
    # `"name":value,...` with `body` holding only the small ones: the parsed tree of a 16 MB
    # body is hundreds of MB of Python objects and is not kept past parsing.
    bulk: bytes | None = None
    # How many of the bulk's leading bytes are its PROMPT_FIELDS (`"messages":[...],...`).
    bulk_prompt_bytes: int = 0
    # Whether orjson read the body (gateway/json_body.py): then orjson may write it again.
    by_orjson: bool = False
    # The http(s) media URLs of a chat body, each with the field it is in, for
    # gateway/media_urls.py to check before anything is sent.
    media_urls: tuple[tuple[str, str], ...] = ()


def parse_request(
    path: str, raw: bytes, admit_model: Callable[[str, str | None], None] | None = None
) -> ProxiedRequest:
    """The whole check of a proxied body: JSON, encodable text, then `admit_model(model,
    adapter)` (a key's allowlists, so they answer before any other field is judged), then the
    fields."""
    body = parse_json_object(raw)
    if admit_model is not None:
        admit_model(*requested_model(body))
    return parse_proxied_request(path, body)


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than {max_bytes} bytes.", code="request_too_large"
    )


def parse_proxied_request(path: str, body: dict[str, Any]) -> ProxiedRequest:
    redirecting = REDIRECTING_FIELDS & body.keys()
    if redirecting:
        field = min(redirecting)
        raise bad_request(
            f"The field '{field}' is not accepted: the gateway chooses where requests go.",
            param=field,
            code="unsupported_field",
        )
    selecting = ADAPTER_SELECTING_FIELDS & body.keys()
    if selecting:
        field = min(selecting)
        raise bad_request(
            f"The field '{field}' is not accepted: name an adapter as "
            "'model': '<model>:<adapter>'.",
            param=field,
            code="unsupported_field",
        )
    code = CODE_FIELDS & body.keys()
    if code:
        field = min(code)
        raise bad_request(
            f"The field '{field}' is not accepted: the gateway passes no code to an engine.",
            param=field,
            code="unsupported_field",
        )
    uncounted = UNCOUNTED_PROMPT_FIELDS.keys() & body.keys()
    if uncounted:
        field = min(uncounted)
        raise bad_request(
            f"The field '{field}' ({UNCOUNTED_PROMPT_FIELDS[field]}) is not accepted: the "
            "gateway counts a prompt against the request limits; send it as "
            "'messages' or 'prompt'.",
            param=field,
            code="unsupported_field",
        )
    model, adapter = requested_model(body)
    _check_numbers(body)
    _check_cache_salt(body)
    if path == EMBEDDINGS:
        _check_embedding_input(body)
        return ProxiedRequest(path, body, model, adapter, False, False, _user(body))
    media_urls: list[tuple[str, str]] = []
    if path == CHAT:
        _check_messages(body, media_urls)
    else:
        _check_prompt(body)
    _check_logprobs(path, body)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    wants_usage = _wants_usage(body)
    return ProxiedRequest(
        path, body, model, adapter, stream, wants_usage, _user(body), media_urls=tuple(media_urls)
    )


def requested_model(body: dict[str, Any]) -> tuple[str, str | None]:
    """(model, LoRA adapter or None), checked first so a key's allowlist answers before any
    other field is judged."""
    model = body.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL_NAME:
        raise bad_request(
            f"'model' must be a string of 1 to {MAX_MODEL_NAME} characters.", param="model"
        )
    base, sep, adapter = model.partition(":")
    if sep and (not base or not adapter):
        raise bad_request("Name a LoRA adapter as 'model': '<model>:<adapter>'.", param="model")
    return base, adapter or None


# Ranged fields by name, with their place in the order they are judged (of several out of range,
# the first is named): a body names few, so its own names are looked up (a chat: 1.7 to 0.9 us).
_RANGED = {r[0]: (i, r) for i, r in enumerate((*NUMERIC_RANGES, *ENGINE_RANGES))}


def _check_numbers(body: dict[str, Any]) -> None:
    ranged = [_RANGED[name] for name in body if name in _RANGED]
    if len(ranged) > 1:
        ranged.sort()
    for _, (field, low, high, integer) in ranged:
        value = body[field]
        if value is None:
            continue
        # bool is an int in Python, and NaN compares false with everything: refuse both.
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_number or (integer and not isinstance(value, int)):
            kind = "an integer" if integer else "a number"
            raise bad_request(f"'{field}' must be {kind}.", param=field, code="invalid_type")
        if not low <= value <= high or (isinstance(value, float) and math.isnan(value)):
            shown = (f"{low:,}", f"{high:,}") if integer else (f"{low:g}", f"{high:g}")
            raise bad_request(
                f"'{field}' must be between {shown[0]} and {shown[1]}; got {value!r}.",
                param=field,
                code="invalid_value",
            )


def _check_cache_salt(body: dict[str, Any]) -> None:
    salt = body.get(CACHE_SALT)
    if salt is not None and (not isinstance(salt, str) or not 1 <= len(salt) <= MAX_CACHE_SALT):
        raise bad_request(
            f"'{CACHE_SALT}' must be a string of 1 to {MAX_CACHE_SALT:,} characters.",
            param=CACHE_SALT,
            code="invalid_type" if not isinstance(salt, str) else "invalid_value",
        )


def _check_logprobs(path: str, body: dict[str, Any]) -> None:
    logprobs = body.get("logprobs")
    if logprobs is None:
        return
    if path == CHAT:
        if not isinstance(logprobs, bool):
            raise bad_request("'logprobs' must be a boolean.", param="logprobs")
        return
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 20:
        raise bad_request(
            "'logprobs' must be an integer between 0 and 20.",
            param="logprobs",
            code="invalid_value",
        )


def _check_messages(body: dict[str, Any], media_urls: list[tuple[str, str]]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"'messages[{i}]' must be an object.", param=f"messages[{i}]")
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                _check_text_part(part, f"messages[{i}].content[{j}]")
                _check_media_part(part, f"messages[{i}].content[{j}]", media_urls)


def _check_text_part(part: object, where: str) -> None:
    # A text part without text (null, a number) is not something an engine is sure to refuse
    # cleanly: some answer 500, which would read as the gateway's fault.
    if isinstance(part, dict) and "text" in part and not isinstance(part["text"], str):
        raise bad_request(f"'{where}.text' must be a string.", param=f"{where}.text")


def _check_media_part(part: object, where: str, media_urls: list[tuple[str, str]]) -> None:
    if not isinstance(part, dict):
        return
    for kind in MEDIA_PARTS:
        media = part.get(kind)
        if isinstance(media, dict):
            urls = [(f"{kind}.{name}", media.get(name)) for name in MEDIA_URL_NAMES]
        else:
            urls = [(kind, media)]
        for name, url in urls:
            if not isinstance(url, str):
                continue
            scheme = url[:8].lower()
            if not scheme.startswith(ALLOWED_MEDIA_SCHEMES):
                raise bad_request(
                    f"'{where}.{name}' must be an http(s) or data: URL; local paths are not "
                    "accepted.",
                    param=f"{where}.{kind}",
                    code="unsupported_url",
                )
            if not scheme.startswith("data:"):
                media_urls.append((f"{where}.{kind}", url))


def _is_text_or_tokens(value: object) -> bool:
    """A string, or a non-empty array of strings, of token ids, or of arrays of token ids: the
    shapes OpenAI's prompt and input take. Anything else would reach an engine unchecked."""
    if isinstance(value, str):
        return True
    if not isinstance(value, list) or not value:
        return False
    if all(isinstance(item, str) for item in value):
        return True
    return all(_is_token_ids(item) for item in value)


def _is_token_ids(value: object) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_is_token_id(item) for item in value)
    return _is_token_id(value)


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_prompt(body: dict[str, Any]) -> None:
    if "prompt" not in body:
        raise bad_request("You must provide a prompt parameter.", param="prompt")
    if not _is_text_or_tokens(body["prompt"]):
        raise bad_request(
            "'prompt' must be a string or a non-empty array of strings or token ids.",
            param="prompt",
        )


def _check_embedding_input(body: dict[str, Any]) -> None:
    if not _is_text_or_tokens(body.get("input")):
        raise bad_request(
            "'input' must be a string or a non-empty array of strings or token ids.",
            param="input",
        )


def _wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise bad_request(
            "'stream_options.include_usage' must be a boolean.",
            param="stream_options.include_usage",
        )
    return include


def _user(body: dict[str, Any]) -> str | None:
    user = body.get("user")
    if user is None:
        return None
    if not isinstance(user, str) or len(user) > MAX_MODEL_NAME:
        raise bad_request(
            f"'user' must be a string of at most {MAX_MODEL_NAME} characters.", param="user"
        )
    return user
