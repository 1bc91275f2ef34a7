"""What the parts of the replica workflow call on one another. ReplicaWorkflow (workflow.py)
mixes the parts in (life.py, engine_run.py, stopping.py, adapters.py), each a subclass of
ReplicaParts, and provides or inherits everything declared here. Declared once, for the type
checker only: at run time the class holds nothing, so no declaration can hide a real method."""

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        Allocation,
        EngineExit,
        ReplicaCarried,
        ReplicaInput,
        ReplicaState,
        ReplicaView,
        Route,
        ShardAllocation,
    )


class ReplicaParts:
    inp: ReplicaInput
    s: ReplicaCarried

    if TYPE_CHECKING:
        # Provided by ReplicaWorkflow itself.
        @property
        def view(self) -> ReplicaView: ...

        def _label(self) -> None: ...

        async def _set_state(
            self, state: ReplicaState, detail: str = "", publish: bool = True
        ) -> None: ...

        def _route(self, node: str, endpoint: str) -> Route: ...

        def _exit(self, reason: str) -> EngineExit: ...

        async def _tell_model_ready(self, *, adapters_at_runtime: bool = True) -> None: ...

        # Provided by one part, called by another.
        async def _run_engine_once(self, alloc: Allocation) -> EngineExit: ...

        async def _stop_for_good(
            self, alloc: Allocation, drain: timedelta, interrupt: Callable[[], bool]
        ) -> bool: ...

        async def _sleep_unless(self, interrupt: Callable[[], bool], delay: timedelta) -> bool: ...

        async def _continue_as_new_if_due(self) -> None: ...

        def _launch_with_next_model(self, alloc: Allocation) -> None: ...

        async def _update_adapters(self, alloc: Allocation, ended: Callable[[], bool]) -> None: ...

        async def _leave_taken_ports(self, err: ActivityError) -> EngineExit: ...

        async def _stop_engine(
            self,
            alloc: Allocation,
            drain: timedelta = timedelta(0),
            shards: Sequence[ShardAllocation] | None = None,
            give_up: timedelta = options.STOP_GIVE_UP,
            interrupt: Callable[[], bool] = lambda: False,
        ) -> list[ShardAllocation]: ...
