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
    # The web console on the public listener too, under /console/, behind a login with an admin
    # key (gateway/console/remote.py). Off: the console is on the loopback admin listener only.
    console_remote: bool = False
    # An OTLP/HTTP receiver for the request path's spans (docs/tracing.md), e.g.
    # http://collector:4318; empty: the gateway does not trace.
    otlp_endpoint: str = ""
    # The last requests this gateway process keeps in memory for GET /admin/v1/requests and the
    # console's Requests page, and the per-model and per-key charts fed by the same records
    # (gateway/observe/). 0: neither; a request then records nothing.
    request_log_size: int = Field(default=1000, ge=0, le=1_000_000)
    # How often the routing table is re-read from the ledger: a replica-state change should
    # reach every gateway within about a second.
    refresh_interval_s: float = Field(default=0.5, gt=0, le=10)
    # How soon a revoked key stops working in a running gateway.
    key_refresh_interval_s: float = Field(default=1.0, gt=0, le=60)
    usage_flush_interval_s: float = Field(default=1.0, gt=0, le=60)
    # Keys' limits are shared by every gateway on the store through leases
    # (gateway/shared_limits.py): how often this gateway reports spend, gives back what it does
    # not need and renews its leases, in one transaction for all keys.
    quota_sync_interval_s: float = Field(default=0.5, gt=0, le=10)
    # How long a gateway that cannot reach its store keeps serving the keys it knows, spending
    # only the limits it holds; past it every request gets 503 until the store is back.
    store_outage_grace_s: float = Field(default=30.0, ge=0, le=3600)
    upstream_connect_timeout_s: float = Field(default=5.0, gt=0)
    # Between two reads from an engine: long enough for a slow first token on a busy replica.
    upstream_read_timeout_s: float = Field(default=600.0, gt=0)
    # An idle connection to an engine is reused for at most this long. Engines close idle
    # keep-alive connections after 5 s (llama-server's cpp-httplib, and uvicorn's default,
    # which vLLM keeps); a pool that held them longer would now and then write a request onto
    # a connection the engine was closing at that instant (gateway/proxy.py sends it again).
    upstream_keepalive_s: float = Field(default=4.0, gt=0)
    # A streaming client must take each write within this long, or it is dropped and the
    # engine's request cancelled: a client that stops reading cannot keep a replica generating
    # (gateway/relay.py). Token streams need a few KB/s; a stalled write means no reading at all.
    stream_write_timeout_s: float = Field(default=30.0, gt=0)
    # A request for a model scaled to zero waits this long for a replica to serve, then 503.
    cold_start_timeout_s: float = Field(default=180.0, ge=0)
    # A request's deadline for finding a replica that answers: a failure before the first byte
    # moves the request to another replica only while this much time (or the client's own
    # timeout, from OpenAI SDKs' X-Stainless-Timeout header) is left.
    request_deadline_s: float = Field(default=600.0, gt=0)
    # How the gateway picks a replica: "prefix" (longest cached prompt prefix, then session,
    # then least load), "least_load" or "round_robin" (for comparison).
    routing_policy: str = Field(default="prefix", pattern=r"^(prefix|least_load|round_robin)$")
    # Sticky until saturated ("prefix" policy, docs/sticky-routing.md): the replica holding a
    # request's prefix keeps getting it while the prompt tokens waiting to be prefilled there,
    # this request's included, would take at most this long at the replica's measured prefill
    # rate; past that, the replica with the least predicted wait, its own prefill counted, the
    # holder included. 1 s is the target to try: about where an interactive user notices the
    # wait, and on a GPU several whole prompts' prefill. Off (0: the request-count margin,
    # OverloadMargin) by default until it wins in both of the routing benchmark's settings: in
    # its last run (docs/benchmarks.md, "Sticky until saturated") its mean TTFT was 1.11x the
    # margin's with llama.cpp's default cache and 1.08x with the small one.
    routing_ttft_target_s: float = Field(default=0.0, ge=0, le=60)
    # A replica's prefill rate before its first measured request (tokens a second); learnt
    # per replica from then on (gateway/routing/token_load.py).
    routing_prefill_tokens_per_s: float = Field(default=2000.0, gt=0)
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
    # Bodies larger than this are parsed and checked in worker processes (gateway/body_parse.py),
    # not on the event loop: a 16 MB body of small JSON values takes seconds to parse.
    inline_parse_bytes: int = Field(default=64 * 1024, ge=0)
    # Worker processes parsing large bodies, hence large bodies parsed at once; each peaks at
    # about 30 times the body's bytes for the worst shapes (docs/gateway.md).
    body_parse_workers: int = Field(default=2, ge=1, le=64)
    # How long a large body waits for a free worker before 503 with Retry-After.
    body_parse_wait_s: float = Field(default=2.0, ge=0)
    # Where media URLs may point besides public addresses (gateway/media_urls.py): CIDRs, and
    # host names trusted as they are. Empty: loopback, private and link-local are refused.
    media_url_allow: list[str] = Field(default_factory=list)
    # Per request, before anything reaches an engine (gateway/request_limits.py); a key's own
    # limits (KeyLimits) replace these. Observed without them: 20,000 one-token prompts in one
    # /v1/completions body kept a CPU llama-server busy 3.5 minutes, and 4.2 million prompts
    # in a 16 MB body grew it to 23 GB until the kernel killed it.
    # Array items in `prompt` (completions) or `input` (embeddings): 2,048 is OpenAI's own cap
    # for embeddings inputs, the batch size SDKs and LangChain split into, so they keep working.
    max_prompts_per_request: int = Field(default=2048, ge=1)
    # Sequences one request makes the engine generate: `n`, `best_of`, and for completions
    # prompts x max(n, best_of). 128 is OpenAI's cap on `n`; a completions request may batch
    # 128 prompts, not 2,048, because each one is a whole generation, not one forward pass.
    max_choices_per_request: int = Field(default=128, ge=1)
    # The prompt's upper-bound estimate (gateway/prompt_estimate.py, about one token per byte):
    # about 1 MB of text, above any model's context window even at four bytes a token, and far
    # below what the 16 MiB body cap would let through.
    max_prompt_tokens_per_request: int = Field(default=1_048_576, ge=1)
    # Per key: the estimated prompt tokens of all its requests in flight together (429 past
    # it, gateway/key_inflight.py). Four requests at the per-request ceiling, or hundreds of
    # ordinary ones; one client cannot fill every engine's queue with huge prompts.
    max_inflight_prompt_tokens: int = Field(default=4 * 1_048_576, ge=1)
    # Requests this gateway has in flight to one replica, at most. With the fair queue on, the
    # most a replica's learnt depth can grow to, and the depth of a replica whose engine has no
    # request gauges; off, when every ready replica of a model holds this many a request gets
    # 429 `replicas_busy`. Counted per gateway. 128 is above what `llmgw bench gateway` drives
    # (64) and within vLLM's default batch (256 sequences).
    max_inflight_per_replica: int = Field(default=128, ge=1)
    # The fair queue (gateway/admission/): a replica is sent only as many requests as its engine
    # runs at once (learnt from its gauges); the rest wait in the gateway, fair among keys by
    # tokens (a key's `weight`) and ordered by priority class, rather than in the engine's
    # arrival order. Off: every request goes straight to an engine, as before.
    fair_queue: bool = True
    # The longest a request waits in the queue (503 `queue_timeout` with Retry-After past it);
    # requests of the batch class wait up to batch_queue_deadline_s. A client's own timeout
    # (x-stainless-timeout) shortens both.
    queue_deadline_s: float = Field(default=60.0, gt=0, le=3600)
    batch_queue_deadline_s: float = Field(default=600.0, gt=0, le=86400)
    # Requests of one key and one class waiting for one model at once (429 `queue_full` past it).
    queue_per_key: int = Field(default=1000, ge=1, le=1_000_000)
    # A lower-class request that has waited this long gets every fourth turn while higher
    # classes have requests waiting, so a flood of higher classes never starves a lower one
    # (0: strict classes).
    queue_aging_s: float = Field(default=10.0, ge=0, le=3600)
    # Several gateways on one store share each model's slots by their keys' weights: every
    # quota_sync_interval_s each tells the others, through the store, what its queue holds
    # (gateway/queue_exchange.py), so a key cannot get more than its share by spreading its
    # requests over gateways. Off: each gateway's queue is fair among its own requests only.
    queue_exchange: bool = True
    # Replicas that publish KV events (vLLM with kv_events) are routed by the blocks their
    # engines report (gateway/kv/feeds.py), which needs each prompt's token ids: the gateway asks
    # an engine's /tokenize and waits this long for them before routing without (0: never ask).
    kv_tokenize_timeout_s: float = Field(default=0.5, ge=0, le=10)
    # The most block ids the gateway keeps per replica: about 78 bytes each, so ~20 MB per
    # replica at the default (kv/index.py). An engine's own cache is usually smaller.
    kv_index_max_blocks: int = Field(default=262_144, ge=1)
    # The gateway processes on one store (several gateways, or `--workers N`) tell each other
    # what they send where, their requests in flight and their breakers' changes, over a peer
    # bus of their own (gateway/peers/): each finds the others through the store and listens on
    # peer_host (any free port). A process that starts takes a peer's snapshot before it serves.
    # Off: each process routes by its own record alone.
    peer_bus: bool = True
    # The address the other gateways reach this one's bus at (it listens there too). Empty: the
    # gateway's own host, or where that is a wildcard (0.0.0.0, ::), this machine's name.
    peer_host: str = ""
