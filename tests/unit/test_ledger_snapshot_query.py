"""`ledger_snapshot` (what `llmgw status` and `llmgw nodes` read) asks a ledger again when its
query times out, as one does while Temporal still sends it to a control worker that just died;
anything else still fails at once."""

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from workers.progress import QUERY_TRIES, ledger_snapshot
from workflows.contracts import LedgerState, NodeInventory, NodeRecord
from workflows.ledger_compact import pack_state

STATE = LedgerState(nodes={"n1": NodeRecord(inventory=NodeInventory(name="n1"))})


class FlakyLedger:
    """A workflow handle and its client in one: the first `failures` queries fail with `status`."""

    def __init__(self, failures: int, status: RPCStatusCode) -> None:
        self.failures, self.status, self.queries = failures, status, 0

    def get_workflow_handle(self, workflow_id: str, **_: Any) -> "FlakyLedger":
        return self

    async def query(self, *_: Any, **__: Any) -> object:
        self.queries += 1
        if self.queries <= self.failures:
            raise RPCError("Timeout expired", self.status, b"")
        return pack_state(STATE)


@pytest.mark.parametrize(
    "status", [RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE]
)
async def test_a_query_that_times_out_is_asked_again(status: RPCStatusCode) -> None:
    ledger = FlakyLedger(failures=QUERY_TRIES - 1, status=status)
    state = await ledger_snapshot(ledger)  # type: ignore[arg-type]
    assert state.nodes.keys() == {"n1"}
    assert ledger.queries == QUERY_TRIES


async def test_a_ledger_that_never_answers_fails_after_the_last_try() -> None:
    ledger = FlakyLedger(failures=QUERY_TRIES, status=RPCStatusCode.CANCELLED)
    with pytest.raises(RPCError, match="Timeout expired"):
        await ledger_snapshot(ledger)  # type: ignore[arg-type]
    assert ledger.queries == QUERY_TRIES


async def test_other_errors_are_not_asked_again() -> None:
    ledger = FlakyLedger(failures=1, status=RPCStatusCode.PERMISSION_DENIED)
    with pytest.raises(RPCError):
        await ledger_snapshot(ledger)  # type: ignore[arg-type]
    assert ledger.queries == 1
