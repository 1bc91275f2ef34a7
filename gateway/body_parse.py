"""All of a proxied body's O(size) work in one call, and large bodies kept off the event loop.

Parsing, validating and estimating a body costs time in proportion to the number of JSON values
it holds, not to its bytes: a 16 MB string parses in 30 ms, but a 16 MB `[[0],[0],...]` is four
million lists and takes seconds (json.loads ~2.5 s, the checks and the prompt estimate ~4 s
more) and ~400 MB of Python objects. Measured before this module, one such body blocked every
other request of the gateway for 5.3 s, and four at once took it to 1.28 GB.

A thread does not help: json.loads is one C call that holds the GIL from start to end (measured:
the event loop's thread got no turn for the 2.4 s of the parse). So a body above
`inline_parse_bytes` is parsed in a worker process, at most `body_parse_workers` at once: the
event loop only waits on a pipe, and the parsed tree lives and dies in the worker. What comes
back is small (the body's scalar fields, the prompt estimate, at most 64 KB of routing prompt)
plus the body's bulky fields serialised once, which is what goes upstream; so the gateway holds
about twice the body's bytes per large request, never its tree.

A body above `inline_parse_bytes` of no more JSON values than an inline body may hold is still
parsed inline: up to a few times that size, read by orjson first and its tree's items counted
(`read_first`); else where its bytes bound its values (`few_values`). An agent's 200 KB context
is a few long strings, which orjson reads at C speed (about 0.1 ms; gateway/json_body.py),
while the worker's round trip (pickling the body there and its bulk back, the pool's threads
and pipes) cost 3 to 9 ms of CPU per request; and the client's own bytes then go upstream, or,
where the gateway changed a field, the body as orjson writes it (0.02 ms for 200 KB). The
many-small-values bodies above still go to a worker.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway.errors import SERVER_ERROR, ApiError, bad_request
from gateway.json_body import count_byte, read_fast, read_json_object
from gateway.media_urls import MediaPolicy, pinned_urls
from gateway.prompt_estimate import estimate_prompt_tokens
from gateway.request_body import (
    CACHE_SALT,
    PROMPT_FIELDS,
    ProxiedRequest,
    parse_proxied_request,
    requested_model,
)
from gateway.routing.request_key import prompt_bytes

log = logging.getLogger(__name__)

# Checks of the whole parsed request that need its tree (request limits): run where the tree is,
# so for a large body in the worker process, and must pickle (a module-level function, or a
# functools.partial of one over picklable values).
Check = Callable[[ProxiedRequest], None]
AdmitModel = Callable[[str, str | None], None]

# Top-level string fields up to this long stay in the small part of a split body (model and user
# are at most 256 characters); longer ones travel with the bulk.
SMALL_STRING = 1024
# stream_options is rewritten by the gateway (include_usage), so it must stay a small field; it
# holds a boolean or two in OpenAI's API.
MAX_STREAM_OPTIONS_BYTES = 4096
RETRY_AFTER_S = "1"
# How much lower a body-parsing worker's CPU priority is than the gateway's.
WORKER_NICE = 10
# How often a body-parsing worker looks whether its gateway still runs.
ORPHAN_CHECK_S = 1.0
# A body above the inline size is parsed inline when it is at most this many times that size
# and holds at most one JSON value or member name per INLINE_BYTES_PER_VALUE bytes of that size
# (8,192 with the default 64 KB): measured, a 64 KB body of the costliest shape inline today (chat
# messages of one-letter text parts, 10,600 of them) took 14 ms to prepare; 8,192 of them take
# about 11 ms, and a 1 MB string adds 3 to 5 ms.
INLINE_SIZE_FACTOR = 16
INLINE_BYTES_PER_VALUE = 8
# Every JSON value but the outermost follows a `[`, `,` or `:`, and every member name a `{` or
# `,`, so one more than the count of those bytes bounds the values and names together (those
# inside strings only make the bound looser). Invalid JSON too: json stops at its first error,
# and what it read before that is the start of some valid JSON, whose values and names follow
# those bytes just the same; nothing but the parse runs on a body it refused.
# bytes.replace(byte, b"", n) counts them fastest (the bytes it deleted): it goes from one
# occurrence to the next with C's memchr, which scans many bytes per instruction, stops after n
# of them (so at most the bound's worth of occurrences are visited, whatever the body), and
# returns the body itself, not a copy, when the byte is absent (where it is present, it copies
# the body less what it deleted: perf put those copies at about half of this count's time inside
# the gateway, whose whole count was about a tenth of a 200 KB request's CPU; so in a body of
# 32 KB or more the first few are found with `find`, json_body.count_byte). Measured on the
# 200 KB chat bodies of bench/gateway/large.py (shared 2-core VM): about 60 us for the four, where
# deleting every other byte in one bytes.translate pass took 95 to 100 (and bytes.count, a
# byte-at-a-time loop, about as long per byte); a 1 MB `[0,0,...]`, 0.1 ms where it took 0.4.
STRUCTURAL_BYTES = (b",", b":", b"{", b"[")
# A body above the inline size and at most READ_FIRST_FACTOR times it is first read by orjson on
# the loop, where its bytes hold fewer `{` and `[` than the inline bound of values, and kept
# inline where the tree holds at most half that bound of items (each member is a name and a
# value): the tree's own count, without `few_values`' count of the commas, which was about a
# tenth of a 200 KB request's CPU (py-spy). Bounded so that orjson's reading of a body that
# then goes to a worker costs the loop no more than an inline body may: measured, orjson takes
# 0.7 to 1.3 ms for 256 KB of `[0,0,...]` and 3 ms of short strings; the costliest shapes are
# containers (10 ms for 256 KB of `[[],[],...]`), which the count of `{` and `[` keeps out.
READ_FIRST_FACTOR = 4
CONTAINER_BYTES = (b"{", b"[")


@dataclass(frozen=True)
class Refusal:
    """An ApiError as it crosses back from a worker (exceptions with keyword-only arguments do
    not survive pickling)."""

    status: int
    message: str
    type_: str
    param: str | None
    code: str | None

    @classmethod
    def of(cls, err: ApiError) -> Refusal:
        return cls(err.status, err.message, err.type_, err.param, err.code)

    def error(self) -> ApiError:
        return ApiError(
            self.status, self.message, type_=self.type_, param=self.param, code=self.code
        )


@dataclass(frozen=True, slots=True)
class Prepared:
    # The model and adapter, once the body got that far: the key's allowlists answer before a
    # refusal of any later field, as they do for a body parsed inline.
    model: str | None
    adapter: str | None
    request: ProxiedRequest | None
    refusal: Refusal | None


def prepare(
    path: str,
    raw: bytes,
    check: Check | None = None,
    split: bool = False,
    read: dict[str, Any] | None = None,
) -> Prepared:
    """Parse, validate, estimate and run `check`; with `split`, keep only the small fields in
    `request.body` and serialise the rest into `request.bulk`. `read`: the body's tree, where
    orjson has read it already (`read_first`). Pure: runs inline or in a worker."""
    model: str | None = None
    adapter: str | None = None
    try:
        body, by_orjson = (read, True) if read is not None else read_json_object(raw)
        model, adapter = requested_model(body)
        request = parse_proxied_request(path, body)
        request = _prepared(request, estimate_prompt_tokens(body), prompt_bytes(body), by_orjson)
        if check is not None:
            check(request)
        if split:
            request = _split(request)
    except ApiError as err:
        return Prepared(model, adapter, None, Refusal.of(err))
    return Prepared(model, adapter, request, None)


def _prepared(
    request: ProxiedRequest,
    prompt_estimate: int,
    routing_prompt: bytes,
    by_orjson: bool,
) -> ProxiedRequest:
    """`request` with the fields `prepare` fills in, its fields dict copied: per request,
    dataclasses.replace looks the dataclass's fields up again, and a frozen class's __init__
    sets each field through object.__setattr__ (measured on a small chat body: 2.4 and 1.3 us,
    this 0.3)."""
    new = object.__new__(ProxiedRequest)
    fields = new.__dict__
    fields.update(request.__dict__)
    fields["prompt_estimate"] = prompt_estimate
    fields["routing_prompt"] = routing_prompt
    fields["by_orjson"] = by_orjson
    return new


def read_first(raw: bytes, inline_bytes: int) -> dict[str, Any] | None:
    """orjson's tree of a body larger than `inline_bytes` that may be prepared inline
    (READ_FIRST_FACTOR), else None: too large, too many containers or items, or not one that
    orjson reads as json would (json_body.read_fast)."""
    if not _bounded(raw, inline_bytes, READ_FIRST_FACTOR, CONTAINER_BYTES):
        return None
    return read_fast(raw, inline_bytes // INLINE_BYTES_PER_VALUE // 2)


def few_values(raw: bytes, inline_bytes: int) -> bool:
    """Whether a body larger than `inline_bytes` may still be prepared inline: its size and the
    bound on its JSON values that its bytes give keep it as cheap to parse as an inline body."""
    return _bounded(raw, inline_bytes, INLINE_SIZE_FACTOR, STRUCTURAL_BYTES)


def _bounded(raw: bytes, inline_bytes: int, size_factor: int, counted: tuple[bytes, ...]) -> bool:
    """Whether `raw` is at most `size_factor` times `inline_bytes` long and holds fewer than
    inline_bytes // INLINE_BYTES_PER_VALUE of the `counted` bytes in all."""
    if len(raw) > size_factor * inline_bytes:
        return False
    # `left` is how many more may follow, so each count stops as soon as the body is known to
    # have too many.
    left = inline_bytes // INLINE_BYTES_PER_VALUE
    for byte in counted:
        left -= count_byte(raw, byte, left)
        if left <= 0:
            return False
    return True


def _worker_starts(gateway_pid: int) -> None:
    # A worker shares the machine's cores with the event loop that serves every other request
    # (on a gateway pinned to one core, the very same core): the loop must win when they
    # compete, and a large body may take a little longer.
    os.nice(WORKER_NICE)
    threading.Thread(
        target=_end_with, args=(gateway_pid,), name="gateway-watch", daemon=True
    ).start()


def _end_with(gateway_pid: int) -> None:
    """End this worker once its gateway is gone. A worker's parent is the forkserver, not the
    gateway, and the worker holds the pipe that keeps the forkserver up: a gateway killed
    without shutting its pool down (SIGKILL, the OOM killer) left both running for good (seen
    after test runs: about 90 MB each). When the worker ends, the forkserver sees its last
    client gone and ends too."""
    while True:
        time.sleep(ORPHAN_CHECK_S)
        try:
            os.kill(gateway_pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (its number another user's now)
            os._exit(0)


def _prepare_in_worker(path: str, raw: bytes, check: Check | None) -> Prepared:
    # The cyclic collector runs again and again while json.loads makes millions of lists, each
    # pass over every object so far: measured, it made a 16 MB parse 3 to 5 times slower. A
    # parsed body holds no cycles (reference counting frees it), so it is off for the parse.
    gc.disable()
    try:
        return prepare(path, raw, check, split=True)
    finally:
        gc.enable()


def _split(request: ProxiedRequest) -> ProxiedRequest:
    head: dict[str, Any] = {}
    bulky: dict[str, Any] = {}
    for name, value in request.body.items():
        if name == "stream_options":
            if len(json.dumps(value)) > MAX_STREAM_OPTIONS_BYTES:
                raise bad_request(
                    f"'stream_options' must be at most {MAX_STREAM_OPTIONS_BYTES} bytes.",
                    param="stream_options",
                )
            head[name] = value
        elif _is_small(value) or name == CACHE_SALT:
            # cache_salt is at most 1,024 characters, and the gateway may rewrite it
            # (gateway/cache_salt.py).
            head[name] = value
        else:
            bulky[name] = value
    if not bulky:
        return request
    # The prompt's fields first, so gateway/tokenize.py can send them to an engine's /tokenize
    # as a slice of the bulk, without parsing it again.
    prompt = {name: value for name, value in bulky.items() if name in PROMPT_FIELDS}
    rest = {name: value for name, value in bulky.items() if name not in PROMPT_FIELDS}
    parts = [json.dumps(d, separators=(",", ":")).encode()[1:-1] for d in (prompt, rest) if d]
    bulk = parts[0] if len(parts) == 1 else b",".join(parts)
    return replace(
        request,
        body=head,
        bulk=bulk,
        bulk_prompt_bytes=len(parts[0]) if prompt else 0,
    )


def with_urls_pinned(request: ProxiedRequest, pinned: dict[str, str]) -> ProxiedRequest:
    """`request` with each URL of `pinned` replaced by its pinned form (gateway/media_urls.py)
    wherever it is a member's value, in the bulk that goes upstream: a body parsed inline is
    split first, so the client's own bytes are never sent as they were. In JSON as json.dumps
    writes it, `":"` can only end a member's name and start its value: inside a string every
    quote is escaped. A member elsewhere holding the very same URL is pinned too."""
    if request.bulk is None:
        request = _split(request)
    assert request.bulk is not None  # messages, a list, always travel in the bulk
    at = request.bulk_prompt_bytes
    prompt, rest = request.bulk[:at], request.bulk[at:]
    for url, pin in pinned.items():
        old = b'":' + json.dumps(url).encode()
        new = b'":' + json.dumps(pin).encode()
        prompt, rest = prompt.replace(old, new), rest.replace(old, new)
    return replace(request, bulk=prompt + rest, bulk_prompt_bytes=len(prompt))


def _is_small(value: object) -> bool:
    if isinstance(value, str):
        return len(value) <= SMALL_STRING
    return value is None or isinstance(value, bool | int | float)


def upstream_payload(request: ProxiedRequest, raw: bytes, changed: bool) -> bytes:
    """The body to send upstream: the client's own bytes when nothing changed and the body was
    not split (no second serialisation); changed, the body as it is now, written by orjson
    where orjson read it (json may have read NaN, which orjson would write as null); else the
    small fields as they are now (model renamed, max_tokens clamped, usage asked for) joined to
    the bulk serialised once by `prepare`."""
    if request.bulk is None:
        if not changed:
            return raw
        if request.by_orjson:
            return orjson.dumps(request.body)
        return json.dumps(request.body, separators=(",", ":")).encode()
    head = json.dumps(request.body, separators=(",", ":")).encode()  # always holds "model"
    return b"{" + request.bulk + b"," + head[1:]


def with_member(raw: bytes, member: bytes) -> bytes:
    """`raw`, a JSON object's bytes, with `member` (`"name":value`, a name the object does not
    have) added as its last member: the client's bytes and a few more, not a serialisation."""
    head = raw.rstrip()
    if not head.endswith(b"}"):
        raise ValueError("not a JSON object's bytes")
    head = head[:-1].rstrip()
    return head + (b"" if head.endswith(b"{") else b",") + member + b"}"


class BodyParser:
    """Bodies up to `inline_bytes` are prepared on the event loop (a 64 KB body is at most ~16k
    JSON values: ~10 ms), and so are larger ones of few values (`read_first`, `few_values`);
    the rest in a pool of `workers` processes, started on first use.
    A large body that finds every worker busy waits up to `wait_s` for one, then gets 503 with
    Retry-After: a queue of 16 MB bodies is memory the gateway would hold while they wait."""

    def __init__(
        self, inline_bytes: int, workers: int, wait_s: float, media: MediaPolicy | None = None
    ) -> None:
        self.inline_bytes = inline_bytes
        self.workers = workers
        self.wait_s = wait_s
        # Where media URLs may point (gateway/media_urls.py): public addresses by default.
        self.media = media or MediaPolicy()
        self._pool: ProcessPoolExecutor | None = None
        self._slots = asyncio.Semaphore(workers)

    async def parse(
        self,
        path: str,
        raw: bytes,
        admit_model: AdmitModel | None = None,
        check: Check | None = None,
    ) -> ProxiedRequest:
        if len(raw) <= self.inline_bytes:
            prepared = prepare(path, raw, check)
        elif (read := read_first(raw, self.inline_bytes)) is not None:
            prepared = prepare(path, raw, check, read=read)
        elif few_values(raw, self.inline_bytes):
            prepared = prepare(path, raw, check)
        else:
            prepared = await self._in_worker(path, raw, check)
        if prepared.model is not None and admit_model is not None:
            admit_model(prepared.model, prepared.adapter)
        if prepared.refusal is not None:
            raise prepared.refusal.error()
        request = prepared.request
        assert request is not None
        if request.media_urls:
            # Resolved on the event loop's resolver threads, once, and pinned in what is sent.
            pinned = await pinned_urls(request, self.media)
            if pinned:
                request = with_urls_pinned(request, pinned)
        return request

    async def _in_worker(self, path: str, raw: bytes, check: Check | None) -> Prepared:
        try:
            async with asyncio.timeout(self.wait_s):
                await self._slots.acquire()
        except TimeoutError:
            raise ApiError(
                503,
                "The gateway is parsing as many large request bodies as it allows; "
                "try again shortly.",
                type_=SERVER_ERROR,
                code="busy_parsing",
                headers={"Retry-After": RETRY_AFTER_S},
            ) from None
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executor(), _prepare_in_worker, path, raw, check
            )
        except BrokenProcessPool:
            # A worker died (killed for memory, say): a fresh pool serves the next body.
            log.warning("a body-parsing worker died; starting a new pool")
            self._pool = None
            raise ApiError(
                503,
                "The gateway could not parse this request body; try again shortly.",
                type_=SERVER_ERROR,
                code="parser_restarted",
                headers={"Retry-After": RETRY_AFTER_S},
            ) from None
        finally:
            self._slots.release()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # forkserver, not fork: forking a process that runs an event loop and threads
            # copies their locks in whatever state they are in.
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("forkserver"),
                initializer=_worker_starts,
                initargs=(os.getpid(),),
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
