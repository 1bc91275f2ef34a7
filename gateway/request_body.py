"""Checking an OpenAI request body before anything is sent upstream.

Everything here is pure: the body arrives as bytes, leaves as a `ProxiedRequest` or an ApiError
naming the field at fault. Only the fields the gateway must understand are checked; the rest
pass through to the engine untouched (tools, response_format and the like).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
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

# Strict UTF-8 cannot carry a UTF-16 surrogate, so once the body has decoded, the only way a
# lone one gets into the parsed text is a \uD800-\uDFFF escape, which json.loads accepts. Such
# text cannot be encoded again (UTF-8 for routing, an engine's tokenizer), so it is refused
# here, naming the field. The byte pattern is only a fast path: it also matches valid pairs
# (an emoji written as two escapes) and escaped backslashes ("\\ud800" is not an escape), so a
# match means "walk the body", never "refuse".
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class DuplicateMember(Exception):
    """Raised by the parser's object hook; not a ValueError, so it is not read as bad JSON."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # An object whose name repeats is ambiguous: json.loads keeps the last, an engine's parser
    # may keep the first ("model":"a","model":"b" checked and routed as b, served as a).
    # Measured, the hook costs about 2 us on a 500-byte chat body and 0.5 us an object on a
    # large one (a 7.8 MB body of 200,000 objects: 167 ms to 260 ms); arrays of token ids hold
    # no objects and cost nothing more.
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise DuplicateMember(name)
            seen.add(name)
    return members


# One decoder for every body: json.loads builds a new one per call when given a hook.
DECODER = json.JSONDecoder(object_pairs_hook=unique_members)


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
    # For a large body parsed inline, each top-level member's name, place in the client's bytes
    # and value as parsed (gateway/body_splice.py): what changes is spliced into those bytes.
    members: tuple[tuple[str, int, int, Any], ...] | None = None
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


def decoded(raw: bytes) -> str:
    try:
        # Strict UTF-8 (RFC 8259 for JSON on the wire): json.loads would decode bytes with
        # "surrogatepass" and let an encoded lone surrogate through. A BOM is tolerated.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise bad_request(
            "The request body must be JSON encoded as UTF-8.", code="invalid_json"
        ) from None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    text = decoded(raw)
    try:
        body = DECODER.decode(text)
    except DuplicateMember as dup:
        shown = dup.name if len(dup.name) <= MAX_MODEL_NAME else dup.name[:MAX_MODEL_NAME] + "..."
        raise bad_request(
            f"The JSON body names '{shown}' twice in one object; each name may appear once.",
            param=shown,
            code="duplicate_key",
        ) from None
    except (ValueError, RecursionError):
        # RecursionError: deeply nested arrays exhaust the parser's stack, not ours.
        raise bad_request(
            "We could not parse the JSON body of your request.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    check_surrogates(raw, body)
    return body


def check_surrogates(raw: bytes, body: dict[str, Any]) -> None:
    """Refuse `body`, parsed from `raw`, if a string or a name in it holds a lone surrogate."""
    if len(raw) >= ASCII_WALK_BYTES and _all_ascii(body, len(raw) // ASCII_WALK_BYTES_PER_VALUE):
        return  # no surrogate: every string and name is ASCII
    if _SURROGATE_ESCAPE.search(raw):
        where = lone_surrogate_at(body)
        if where is not None:
            raise bad_request(
                f"'{where}' contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                "escape), which is not text.",
                param=where,
                code="invalid_encoding",
            )


# The byte pattern costs 0.3 to 0.6 ns a byte (one pass of the regex engine, slower where the
# text holds many escapes), a body's long strings included; a walk of the parsed body costs 0.1
# to 0.2 us a value (a message of a role and a string at the low end, text parts at the high),
# its strings' length aside (str.isascii reads a flag). So a large body of few values (an
# agent's context in one or a hundred messages) is walked first: where every string and name is
# ASCII, none holds a surrogate. The walk gives up at the first string that is not ASCII, or
# past one value per ASCII_WALK_BYTES_PER_VALUE bytes, and the pattern runs as before: a walk
# within that budget costs at most about what the pattern would, and one given up adds about as
# much again. Measured on 200 to 240 KB chat bodies (shared 2-core VM, thread CPU time): one
# message, 1.2 us where the pattern took 61; 20 messages, 8 us (135); 100 messages
# (bench/gateway/large.py's transcript), 36 us (61), and 37 (135) with text of many escapes,
# where a budget of one value per 2,048 bytes gave up and ran the pattern; given up, 200
# messages 190 us (141), 25 messages of text parts 130 (74). Below ASCII_WALK_BYTES, the
# pattern only.
ASCII_WALK_BYTES = 16 * 1024
ASCII_WALK_BYTES_PER_VALUE = 512
_SCALARS = (int, float, bool, type(None))


def _all_ascii(body: dict[str, Any], budget: int) -> bool:
    """Whether every string and name in `body` is ASCII (then none holds a surrogate); False
    also when that is not found out within `budget` values, or for a type json does not make."""
    if type(body) is not dict:
        return False
    stack: list[dict[str, Any] | list[Any]] = [body]
    while stack:
        container = stack.pop()
        budget -= len(container)
        if budget < 0:
            return False
        if type(container) is dict:
            if not all(map(str.isascii, container)):
                return False
            values: Iterable[Any] = container.values()
        else:
            values = container
        for value in values:
            kind = type(value)
            if kind is str:
                if not value.isascii():
                    return False
            elif kind is dict or kind is list:
                stack.append(value)
            elif kind not in _SCALARS:
                return False
    return True


# A step down the parsed body: (the path to the parent, a key or an index), None at the top. A
# linked path costs O(1) per value; the string is only built for the value at fault.
_Path = tuple["_Path", str | int] | None


def lone_surrogate_at(body: dict[str, Any]) -> str | None:
    """The path ('messages[0].content', 'user') of the first string or key in `body` holding a
    lone surrogate, or None. Iterative: json.loads nests as deep as the recursion limit, and a
    recursive walk started a few frames down would not."""
    stack: list[tuple[object, _Path]] = [(body, None)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
            return _render(path)
        elif isinstance(value, dict):
            for key in value:
                if not key.isascii() and _SURROGATE.search(key):
                    return _render(path) or "(a field name)"
            stack.extend(((v, (path, k)) for k, v in reversed(value.items())))
        elif isinstance(value, list):
            stack.extend((value[i], (path, i)) for i in range(len(value) - 1, -1, -1))
    return None


def _render(path: _Path) -> str:
    steps: list[str | int] = []
    while path is not None:
        path, step = path
        steps.append(step)
    text = ""
    for step in reversed(steps):
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


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
