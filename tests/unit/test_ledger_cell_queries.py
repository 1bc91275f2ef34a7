"""A query to a ledger cell that is busy placing: Temporal refuses it while it holds one back
("consistent query buffer is full"), and every placement queries every cell, so the caller
must ask again rather than fail the placement (found by `llmgw bench placement --cells 10`,
where eight placements in flight failed within seconds)."""

import asyncio
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from activities.control import ledger_calls
from activities.control.ledger_calls import on_cell


class Client:
    """Hands out handles by workflow id; no server is reached (the asker answers)."""

    def get_workflow_handle(self, workflow_id: str) -> str:
        return workflow_id


BUSY = "consistent query buffer is full, this may be caused by too many queries"


class Asker:
    """Answers a query after refusing it `refusals` times with `status`."""

    def __init__(self, refusals: int, status: RPCStatusCode) -> None:
        self.refusals = refusals
        self.status = status
        self.asked = 0

    async def __call__(self, handle: Any) -> str:
        self.asked += 1
        if self.asked <= self.refusals:
            raise RPCError(BUSY, self.status, b"")
        return "offer"


async def test_a_busy_cell_is_asked_again_until_it_answers() -> None:
    ask = Asker(refusals=3, status=RPCStatusCode.RESOURCE_EXHAUSTED)
    assert await on_cell(Client(), 2, ask) == "offer"  # type: ignore[arg-type]
    assert ask.asked == 4


async def test_a_cell_busy_past_the_retry_time_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_calls, "QUERY_RETRY_S", 0.0)
    ask = Asker(refusals=100, status=RPCStatusCode.RESOURCE_EXHAUSTED)
    with pytest.raises(RPCError):
        await on_cell(Client(), 2, ask)  # type: ignore[arg-type]
    assert ask.asked <= 2


async def test_other_errors_are_not_retried() -> None:
    ask = Asker(refusals=1, status=RPCStatusCode.INVALID_ARGUMENT)
    with pytest.raises(RPCError):
        await on_cell(Client(), 2, ask)  # type: ignore[arg-type]
    assert ask.asked == 1


async def test_a_cell_that_never_ran_answers_none() -> None:
    ask = Asker(refusals=1, status=RPCStatusCode.NOT_FOUND)
    assert await on_cell(Client(), 3, ask) is None  # type: ignore[arg-type]


async def test_a_cell_that_never_answers_fails_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stuck worker must not hold every placement that asks its cell (bench-placement at
    5,000 nodes: all eight lanes waited on one for minutes)."""
    monkeypatch.setattr(ledger_calls, "QUERY_TIMEOUT_S", 0.05)
    never = asyncio.Event()

    async def stuck(_handle: Any) -> str:
        await never.wait()
        return "offer"

    with pytest.raises(TimeoutError):
        await on_cell(Client(), 2, stuck)  # type: ignore[arg-type]
