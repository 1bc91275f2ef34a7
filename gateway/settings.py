"""Gateway settings: plain values the CLI fills in; tests build their own."""

from __future__ import annotations

from pydantic import BaseModel, Field


class GatewaySettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    # The admin API's own listener, loopback only: the public listener never serves /admin, so
    # a reverse proxy or a port opened to the network cannot expose it (0: any free port).
    admin_host: str = "127.0.0.1"
    admin_port: int = Field(default=8001, ge=0, le=65535)
    # How often the routing table is re-read from the ledger: a replica-state change should
    # reach every gateway within about a second.
    refresh_interval_s: float = Field(default=0.5, gt=0, le=10)
    # How soon a revoked key stops working in a running gateway.
    key_refresh_interval_s: float = Field(default=1.0, gt=0, le=60)
    usage_flush_interval_s: float = Field(default=1.0, gt=0, le=60)
    upstream_connect_timeout_s: float = Field(default=5.0, gt=0)
    # Between two reads from an engine: long enough for a slow first token on a busy replica.
    upstream_read_timeout_s: float = Field(default=600.0, gt=0)
    # A request for a model scaled to zero waits this long for a replica to serve, then 503.
    cold_start_timeout_s: float = Field(default=180.0, ge=0)
    # A request's deadline for finding a replica that answers: a failure before the first byte
    # moves the request to another replica only while this much time (or the client's own
    # timeout, from OpenAI SDKs' X-Stainless-Timeout header) is left.
    request_deadline_s: float = Field(default=600.0, gt=0)
    # How the gateway picks a replica: "prefix" (longest cached prompt prefix, then session,
    # then least load), "least_load" or "round_robin" (for comparison).
    routing_policy: str = Field(default="prefix", pattern=r"^(prefix|least_load|round_robin)$")
    # How often each engine's own /metrics is read for its queue (least-load routing).
    engine_scrape_interval_s: float = Field(default=1.0, gt=0, le=60)
    # Failed key checks from one address before it is refused for a while (429 Retry-After).
    auth_failures_before_lockout: int = Field(default=10, ge=1)
    auth_lockout_s: float = Field(default=60.0, gt=0)
    # For keys with a token budget: the longest completion a request without max_tokens is
    # assumed to run to (the gateway does not know each model's context window). Budgets are
    # exact for requests that set max_tokens, and for engines whose context is at most this.
    assumed_context_tokens: int = Field(default=32768, ge=1)
    # Largest request body accepted; bigger is refused before it is buffered.
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
