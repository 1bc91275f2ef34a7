"""The ledger's handlers in Temporal's workflow sandbox, as the ledger ran before it left it
(workflows/ledger.py): for `python -m bench.ledger_sandbox`, which runs both side by side.

A module of its own: the sandbox imports the module of the workflow it runs afresh, and this
one imports only what the ledger does, passed through as the ledger passes it."""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import LedgerState
    from workflows.ledger import ClusterLedgerWorkflow
    from workflows.ledger_compact import PackedLedgerState


@workflow.defn(name="ClusterLedger", sandboxed=True)
class SandboxedLedger(ClusterLedgerWorkflow):
    @workflow.init
    def __init__(self, state: LedgerState | PackedLedgerState | None = None) -> None:
        super().__init__(state)

    @workflow.run
    async def run(self, state: LedgerState | PackedLedgerState | None = None) -> None:
        await super().run(state)
