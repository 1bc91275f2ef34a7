"""The steady load: a few async clients, each posting a small chat completion at a fixed pace
through the gateway, recording what every request came to.

A request that never reached the gateway (connection refused or not accepted while the gateway
restarts) is retried until the gateway is back, up to `connect_patience_s`, and its retries are
counted apart. Why: such a request had no effect anywhere (no tokens, no charge), every OpenAI
SDK retries exactly these errors by itself, and a single gateway process being restarted cannot
accept connections meanwhile, so counting them as failures would measure the restart delay, not
the system. Each request opens a fresh connection (no keep-alive), so "refused" always means
"never sent"; a request that was sent and then lost is never retried, it is a failure. Past the
patience it is a failure too ("gateway unreachable"): a gateway that stays away is an outage.
"""

import asyncio
import time
from dataclasses import dataclass, field

import httpx

OK = "ok"
UNREACHABLE = "gateway unreachable"
RETRY_EVERY_S = 0.5


@dataclass
class RequestRecord:
    started: float  # monotonic, first attempt
    ended: float
    outcome: str  # OK, "<status> <error code>", an exception's name, or UNREACHABLE
    refused: int = 0  # attempts that never reached the gateway before this one got through

    @property
    def ok(self) -> bool:
        return self.outcome == OK


def outcome_of(response: httpx.Response) -> str:
    """OK for a 200 carrying a completion; otherwise the status and the error's code."""
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} not json"
    if response.status_code == 200:
        return OK if isinstance(body, dict) and body.get("choices") else "200 without choices"
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") or error.get("type") if isinstance(error, dict) else None
    return f"{response.status_code} {code or '?'}"


@dataclass
class Load:
    base_url: str
    api_key: str
    model: str
    clients: int = 3
    every_s: float = 1.0  # per client
    max_tokens: int = 8
    timeout_s: float = 150.0  # past the longest freeze: a frozen process delays, not fails
    connect_patience_s: float = 60.0
    records: list[RequestRecord] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list["asyncio.Task[None]"] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(n)) for n in range(self.clients)]

    async def stop(self) -> None:
        """Stop sending; requests in flight are waited for (each is bounded by timeout_s)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _client(self, n: int) -> None:
        # Staggered, so the clients do not all send in the same instant.
        await asyncio.sleep(self.every_s * n / self.clients)
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as http:
            while not self._stop.is_set():
                began = time.monotonic()
                self.records.append(await self.one(http, n))
                await asyncio.sleep(max(0.0, self.every_s - (time.monotonic() - began)))

    async def one(self, http: httpx.AsyncClient, n: int) -> RequestRecord:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"Say one word, client {n}."}],
            "max_tokens": self.max_tokens,
        }
        headers = {"Authorization": f"Bearer {self.api_key}"}
        started, refused = time.monotonic(), 0
        while True:
            try:
                response = await http.post(
                    f"{self.base_url}/chat/completions", headers=headers, json=body
                )
                outcome = outcome_of(response)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                refused += 1
                if time.monotonic() - started < self.connect_patience_s:
                    await asyncio.sleep(RETRY_EVERY_S)
                    continue
                outcome = UNREACHABLE
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            return RequestRecord(started, time.monotonic(), outcome, refused)
