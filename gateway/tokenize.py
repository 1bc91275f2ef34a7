"""A request's prompt as token ids, asked of one of its model's engines, for KV-aware routing.

Replicas that publish KV events (`Route.kv`, vLLM) are routed by the blocks their engines report
holding (gateway/routing/prefix_choice.py), and a block is known by a hash of its token ids
(kv/hashes.py), so the router needs the prompt's tokens as the engine will see them:
the chat template applied, special tokens added. The gateway does not load tokenizers or chat
templates of its own; it asks an engine: vLLM's `POST /tokenize` takes a chat body (`messages`,
`add_generation_prompt`, `tools`, `chat_template_kwargs`) or a completion body (`prompt`) and
answers `{"tokens": [...], "count": n, "max_model_len": m}`. Every replica of a model tokenizes
alike, so one is asked (the least loaded by this gateway's count).

It costs one round trip and one tokenization on the engine per request, so it is bounded: a
short timeout (`kv_tokenize_timeout_s`, which is also the most it can add to a request's
latency), asked only when a candidate replica has `kv` and some candidate's engine reports
holding blocks or has its KV events heard live (a cold model), never for embeddings, several
prompts or media parts (their blocks carry extra keys the gateway does not reproduce). A LoRA
adapter's request is tokenized under the adapter's name, as the engine serves it; its blocks
carry the adapter's key (gateway/routing/kv_blocks.py). A completion prompt given as token ids
is used as it is. Any failure gives None, and routing falls back to the gateway's own prefix
index: tokenizing never fails a request.

A chat whose leading messages (all but the last) came before costs no round trip: the gateway
learns the token ids every chat with them begins with, and routes on those
(gateway/prefix_tokens.py says how it learns and checks them, and what it costs). Nor does a
request whose prompt starts a prefix this gateway never sent anywhere, while no engine holds
blocks another sender left (Router.needs_no_tokens): its tokens would not change where it
goes. A chat's leading part is then learned in the background (gateway/side_tasks.py), for the
requests after it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from gateway.deps import GatewayState
from gateway.prefix_tokens import open_turn, open_turn_fields, prefix_key, tokens_after
from gateway.request_body import CHAT, COMPLETIONS, PROMPT_FIELDS, ProxiedRequest
from gateway.upstream_post import upstream_url
from workflows.contracts import Route

log = logging.getLogger(__name__)

TOKENIZE_PATH = "/tokenize"
# With PROMPT_FIELDS, the body fields that shape a prompt's tokens, sent to /tokenize as the
# client gave them.
_FLAGS = ("add_generation_prompt", "continue_final_message", "add_special_tokens")
# An answer this large (~280,000 token ids) is not parsed on the event loop: json.loads takes
# about 6.5 ms per 100,000 ids (measured), and routing does without.
MAX_ANSWER_BYTES = 2 * 1024 * 1024
_TOKEN_MAX = 2**31 - 1

# "skipped": not asked (several prompts, media parts); "failed": asked, no usable answer;
# "learned": not asked, the chat's leading messages known (gateway/prefix_tokens.py);
# "new_prefix": not asked, a prefix this gateway never sent anywhere.
Outcome = Literal["ok", "skipped", "timeout", "failed", "learned", "new_prefix"]


@dataclass(frozen=True, slots=True)
class TokensLater:
    """A request's prompt token ids, being asked aside: `ids` resolves to them, or to None when
    the engine gave none (it never resolves if the gateway stops first)."""

    ids: asyncio.Future[tuple[int, ...] | None]


@dataclass(frozen=True, slots=True)
class PromptTokens:
    ids: tuple[int, ...]
    # True: only the ids a chat begins with before its last content; the prompt goes on.
    leading_only: bool = False
    # The whole prompt's length in tokens: len(ids), or with `leading_only` an estimate.
    length: int = 0


def tokenize_body(
    chat: bool, body: Mapping[str, Any], bulk_prompt: bytes = b""
) -> bytes | tuple[int, ...] | None:
    """What to POST to /tokenize for this chat or completion body, the token ids themselves
    when the client sent them, or None when asking would not help.

    `bulk_prompt`: for a body gateway/body_parse.py split (a large one), its bulky prompt fields
    serialised as `"messages":[...],...`; `body` then holds only the small fields."""
    fields: dict[str, Any] = {"model": body.get("model")}
    for name in (*PROMPT_FIELDS, *_FLAGS):
        if name in body:
            fields[name] = body[name]
    if chat:
        fields.pop("prompt", None)
        fields.setdefault("add_generation_prompt", True)
        messages = fields.get("messages")
        if messages is not None and _has_media(messages):
            return None
    else:
        fields.pop("messages", None)
        prompt = fields.get("prompt")
        if isinstance(prompt, list):
            if len(prompt) != 1 and not all(_is_token(t) for t in prompt):
                return None  # several prompts: several requests' worth of routing
            if prompt and all(_is_token(t) for t in prompt):
                return tuple(prompt)
            only = prompt[0] if prompt else None
            if isinstance(only, list):
                return tuple(only) if only and all(_is_token(t) for t in only) else None
            if not isinstance(only, str):
                return None
            fields["prompt"] = only
        elif prompt is not None and not isinstance(prompt, str):
            return None
    head = json.dumps(fields, separators=(",", ":")).encode()
    if not bulk_prompt:
        return head
    return b"{" + bulk_prompt + b"," + head[1:]


async def engine_token_ids(
    session: aiohttp.ClientSession,
    route: Route,
    body: Mapping[str, Any],
    key: str | None,
    timeout_s: float,
    *,
    chat: bool | None = None,
    bulk_prompt: bytes = b"",
) -> tuple[int, ...] | None:
    """The prompt of a chat or completion `body` as `route`'s engine tokenizes it, asked with
    the engine's key `key`; None on any failure or after `timeout_s`. `chat`: whether `body` is
    a chat body (by default: whether it has `messages`)."""
    ids, _ = await _ask(session, route, body, key, timeout_s, chat, bulk_prompt)
    return ids


async def _ask(
    session: aiohttp.ClientSession,
    route: Route,
    body: Mapping[str, Any],
    key: str | None,
    timeout_s: float,
    chat: bool | None,
    bulk_prompt: bytes,
) -> tuple[tuple[int, ...] | None, Outcome]:
    made = tokenize_body("messages" in body if chat is None else chat, body, bulk_prompt)
    if made is None:
        return None, "skipped"
    if isinstance(made, tuple):
        return made, "ok"
    return await _post(session, route, made, key, timeout_s)


async def _post(
    session: aiohttp.ClientSession, route: Route, made: bytes, key: str | None, timeout_s: float
) -> tuple[tuple[int, ...] | None, Outcome]:
    """POST one /tokenize body to `route`'s engine."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                upstream_url(route, TOKENIZE_PATH),
                data=made,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as answer:
                if answer.status != 200:
                    log.debug("replica %s: /tokenize answered %d", route.replica_id, answer.status)
                    return None, "failed"
                length = answer.content_length
                if length is not None and length > MAX_ANSWER_BYTES:
                    return None, "failed"
                raw = await answer.content.read(MAX_ANSWER_BYTES + 1)
    except TimeoutError:
        return None, "timeout"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        log.debug("replica %s: /tokenize failed: %r", route.replica_id, exc)
        return None, "failed"
    tokens = _tokens_of(raw) if len(raw) <= MAX_ANSWER_BYTES else None
    return tokens, "ok" if tokens is not None else "failed"


def _tokens_of(raw: bytes) -> tuple[int, ...] | None:
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(_is_token(t) for t in tokens):
        return None
    return tuple(tokens)


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _TOKEN_MAX


def _has_media(messages: object) -> bool:
    """Whether a message has a content part other than text (an image, audio): vLLM adds the
    media's own keys to those blocks' hashes."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
            not (isinstance(part, Mapping) and part.get("type") == "text") for part in content
        ):
            return True
    return False


def cache_salt(body: Mapping[str, Any]) -> str | None:
    """The body's `cache_salt` (vLLM's per-tenant cache isolation) when it is a string."""
    salt = body.get("cache_salt")
    return salt if isinstance(salt, str) and salt else None


def _watching(state: GatewayState, route: Route) -> bool:
    return state.kv_feeds.watching(route) or state.kv_publishers.watching(route)


def kv_candidates(routes: Sequence[Route]) -> list[Route]:
    """The routes that publish KV events, among a model's ready ones."""
    return [route for route in routes if route.kv is not None]


async def request_token_ids(
    state: GatewayState,
    request: ProxiedRequest,
    routes: Sequence[Route],
    routing_prompt: bytes,
    prompt_keys: Sequence[int] | None = None,
) -> PromptTokens | TokensLater | None:
    """For gateway/proxy.py: the prompt's token ids when a ready route of the model publishes
    KV events and the request can use them (see the module's docstring); else None, at no
    cost. A chat whose leading messages the gateway has learned (gateway/prefix_tokens.py) is
    answered with theirs, without asking an engine. A request whose `routing_prompt`
    (RequestKey.prompt) starts a prefix this gateway never sent gets TokensLater: its ids are
    asked aside, for the record of what its engine is about to store. `prompt_keys`: its block
    keys, when already hashed (Router.prompt_keys)."""
    candidates = kv_candidates(routes)
    timeout_s: float = state.settings.kv_tokenize_timeout_s
    if not candidates or timeout_s <= 0:
        return None
    if request.path not in (CHAT, COMPLETIONS):
        return None
    if not any(state.kv_index.size(r.replica_id) or _watching(state, r) for r in candidates):
        # No engine reports holding anything, and none could be heard to: the token ids could
        # not change the choice or a prediction, so no engine is asked. With a feed live, a
        # cold model's first requests are still tokenized: the blocks they will fill decide
        # what their engine evicts for the next ones (gateway/routing/kv_pressure.py).
        state.metrics.kv_tokenized("skipped", 0.0)
        return None
    book = state.prefix_tokens
    learnable = _learnable(state, request)
    counts = state.inflight.counts
    # The least loaded by this gateway's count: the first among equals (they are sorted).
    route = min(candidates, key=lambda r: counts.get(r.replica_id, 0))
    if learnable is not None:
        key = learnable[0]
        known = book.get(key)
        if known is not None:
            if book.spot_check_due():
                # The whole prompt, asked aside, must begin with what was learned.
                state.side_tasks.start(
                    lambda: _spot_check(state, route, request, key), "check leading tokens"
                )
            state.metrics.kv_tokenized("learned", 0.0)
            length = len(known) + tokens_after(request.body)
            return PromptTokens(known, leading_only=True, length=length)
    if state.router.needs_no_tokens(routing_prompt, routes, keys=prompt_keys):
        # This gateway never sent any replica the prompt's prefix, and no engine holds what
        # another sender left: the router places it by what each replica was sent lately,
        # which its token ids would not change, so the request waits for no engine. Its ids
        # are asked aside, and a chat's leading messages learned from them, for the requests
        # that share them; when too many are being asked, the next chat with them learns them
        # on its way, as below.
        state.metrics.kv_tokenized("new_prefix", 0.0)
        later: asyncio.Future[tuple[int, ...] | None] = asyncio.get_running_loop().create_future()
        if state.side_tasks.start(
            lambda: _tokens_aside(state, route, request, learnable, later), "tokenize aside"
        ):
            return TokensLater(later)
        if learnable is not None:
            book.seen_before(learnable[0])
        return None
    if learnable is not None and not book.seen_before(learnable[0]):
        learnable = None  # the first time: worth a second tokenization only if it comes back
    ids = await _token_ids(state, route, request, learnable)
    return PromptTokens(ids, length=len(ids)) if ids is not None else None


async def _tokens_aside(
    state: GatewayState,
    route: Route,
    request: ProxiedRequest,
    learnable: tuple[bytes, bytes] | None,
    later: asyncio.Future[tuple[int, ...] | None],
) -> None:
    """The prompt's token ids into `later` (None on failure), a chat's leading part learned."""
    ids: tuple[int, ...] | None = None
    try:
        ids = await _token_ids(state, route, request, learnable)
    finally:
        if not later.done():
            later.set_result(ids)


async def _spot_check(
    state: GatewayState, route: Route, request: ProxiedRequest, key: bytes
) -> None:
    ids = await _token_ids(state, route, request, None)
    if ids is not None and not state.prefix_tokens.check(request.model, key, ids):
        log.warning("model %s: a chat did not begin as learned; dropped", request.model)


async def _token_ids(
    state: GatewayState,
    route: Route,
    request: ProxiedRequest,
    learnable: tuple[bytes, bytes] | None,
) -> tuple[int, ...] | None:
    """The prompt's token ids from `route`'s engine, counted; with `learnable` (_learnable), a
    chat's leading part learned from the same asks."""
    if learnable is not None:
        return await _learn(state, route, request, *learnable)
    started = time.perf_counter()
    ids, outcome = await _ask_whole(state, route, request)
    state.metrics.kv_tokenized(outcome, time.perf_counter() - started)
    return ids


async def _ask_whole(
    state: GatewayState, route: Route, request: ProxiedRequest
) -> tuple[tuple[int, ...] | None, Outcome]:
    bulk = request.bulk[: request.bulk_prompt_bytes] if request.bulk is not None else b""
    timeout_s: float = state.settings.kv_tokenize_timeout_s
    auth = state.upstream_auth(route)
    return await _ask(
        state.session, route, request.body, auth, timeout_s, request.path == CHAT, bulk
    )


async def _learn(
    state: GatewayState, route: Route, request: ProxiedRequest, key: bytes, opened: bytes
) -> tuple[int, ...] | None:
    """The chat's token ids, and beside them, at once on the same engine, the chat with its
    last content empty (`opened`): what both begin with is learned under `key`
    (gateway/prefix_tokens.py)."""
    started = time.perf_counter()
    auth = state.upstream_auth(route)
    whole = _ask_whole(state, route, request)
    empty = _post(state.session, route, opened, auth, state.settings.kv_tokenize_timeout_s)
    (ids, outcome), (opened_ids, _) = await asyncio.gather(whole, empty)
    if ids is not None and opened_ids is not None:
        state.prefix_tokens.learn(request.model, key, opened_ids, ids)
    state.metrics.kv_tokenized(outcome, time.perf_counter() - started)
    return ids


def _learnable(state: GatewayState, request: ProxiedRequest) -> tuple[bytes, bytes] | None:
    """For a chat whose leading part can be learned: its key and the /tokenize body of the chat
    with its last content empty. Not for a large body the gateway split (its messages are not
    parsed here), media parts, or a model whose template failed the check."""
    if request.path != CHAT or request.bulk is not None:
        return None
    if not state.prefix_tokens.learns(request.model):
        return None
    opened = open_turn(request.body)
    if opened is None or _has_media(request.body.get("messages")):
        return None
    fields = open_turn_fields(request.body, opened)
    key = prefix_key(fields)
    if key is None:
        return None
    return key, json.dumps(fields, separators=(",", ":")).encode()
