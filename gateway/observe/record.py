"""One proxied request as the request log keeps it: filled in as the request goes (the hooks in
gateway/proxy.py, gateway/replica_attempts.py and gateway/relay.py each set an attribute or
two), handed to the log once, where the request ends.

Made only while the log is on (settings.request_log_size > 0): with it off, a request makes no
record and every hook is one `is not None` test.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from typing import TYPE_CHECKING, Any

from gateway.errors import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from gateway.request_body import ProxiedRequest
    from store import ApiKey
    from workflows.contracts import Route

# The header a JSON 500 carries its id in too (gateway/errors.py).
_ID_HEADER = REQUEST_ID_HEADER.encode()
# A prompt kept for a key that logs them (KeyLimits.log_prompts) is cut to this many characters.
PROMPT_CHARS = 4096
# What a request's `x-request-id` starts with: this process's own random part, then a count, so
# ids are unique across the gateway's processes without costing a random draw a request.
_PROCESS_PART = secrets.token_hex(4)
_counter = itertools.count(1)


def new_request_id() -> str:
    return f"req_{_PROCESS_PART}{next(_counter):x}"


class RequestRecord:
    """Plain attributes, each None (or its default) until the request gets that far."""

    __slots__ = (
        "adapter",
        "cached_tokens",
        "completion_tokens",
        "error_code",
        "key_id",
        "key_name",
        "model",
        "node",
        "path",
        "prompt",
        "prompt_tokens",
        "queue_s",
        "reason",
        "replica",
        "request_id",
        "routing_state",
        "started_at",
        "status",
        "stream",
        "total_s",
        "ttft_s",
    )

    def __init__(self, path: str) -> None:
        self.request_id = new_request_id()
        self.started_at = time.time()
        self.path = path
        self.key_id: str | None = None
        self.key_name: str | None = None
        self.model: str | None = None
        self.adapter: str | None = None
        self.stream = False
        self.replica: str | None = None
        self.node: str | None = None
        self.reason: str | None = None  # the router's reason for the replica (prefix, load...)
        self.routing_state: str | None = None
        self.queue_s: float | None = None  # how long the fair queue held it
        self.status = 500
        self.error_code: str | None = None
        self.ttft_s: float | None = None  # streams only: to the first token sent on
        self.total_s = 0.0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None  # as the engine reported them, where it did
        self.prompt: str | None = None  # only for a key that logs its prompts

    def admitted(self, key: ApiKey, request: ProxiedRequest) -> None:
        """The key and what it asks, once the request passed the door."""
        self.key_id = key.key_id
        self.key_name = key.name
        self.model = request.model
        self.adapter = request.adapter
        self.stream = request.stream
        if key.limits.log_prompts:
            self.prompt = prompt_text(request.body)

    def routed(self, route: Route, reason: str, routing_state: str) -> None:
        """The replica tried (the last one, where a request was retried) and why."""
        self.replica = route.replica_id
        self.node = route.node
        self.reason = reason
        self.routing_state = routing_state

    def header(self) -> tuple[bytes, bytes]:
        """The response header that gives the client this request's id: an operator finds the
        client's request in GET /admin/v1/requests by it."""
        return (_ID_HEADER, self.request_id.encode())

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def prompt_text(body: dict[str, Any]) -> str:
    """The request's prompt as text, at most PROMPT_CHARS: its messages (chat), prompt
    (completions) or input (embeddings), as JSON unless it is one string."""
    for field in ("messages", "prompt", "input"):
        if field in body:
            value = body[field]
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            return text[:PROMPT_CHARS]
    return ""
