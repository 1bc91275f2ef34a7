"""Gateway settings: plain values the CLI fills in; tests build their own."""

from __future__ import annotations

from pydantic import BaseModel, Field


class GatewaySettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
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
    # Largest request body accepted; bigger is refused before it is buffered.
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
