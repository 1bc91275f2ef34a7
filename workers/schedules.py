"""The fleet's Temporal Schedules, created (or brought in line) when a control worker starts.

Schedules rather than timers in the node workflows: an operator sees, pauses and triggers them
in the Temporal UI and CLI (`temporal schedule list`), and their runs are ordinary workflows.

The inventory refresh and engine re-verification schedules are paused unless the configuration
asks for them (`refresh_schedules: true`): each agent looks at its machine every minute and
re-verifies its engines every ten while it holds its liveness watch, and only a change reaches
the node's workflow. A run signals every node, which costs each node's history about twenty
events whether or not anything changed; an operator triggers one to refresh the whole fleet now
(`temporal schedule trigger --schedule-id llmgw-engine-reverify`; a trigger runs a paused
schedule too).
"""

import dataclasses
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from workflows.contracts import NodeRefresh
from workflows.fleet import FleetRefreshWorkflow, ScheduledOnboardingWorkflow
from workflows.names import (
    CONTROL_TASK_QUEUE,
    ENGINE_REVERIFY_SCHEDULE_ID,
    ENGINE_REVERIFY_WORKFLOW_ID,
    INVENTORY_REFRESH_SCHEDULE_ID,
    INVENTORY_REFRESH_WORKFLOW_ID,
    SCHEDULED_ONBOARDING_SCHEDULE_ID,
    SCHEDULED_ONBOARDING_WORKFLOW_ID,
)


@dataclass(frozen=True)
class ScheduleSettings:
    reverify_every: timedelta = timedelta(minutes=10)
    inventory_every: timedelta = timedelta(minutes=5)
    onboarding_every: timedelta = timedelta(minutes=1)
    # Onboarding runs only when the configuration names a nodes file.
    onboarding: bool = False
    # The fleet-wide refresh schedules run only when the configuration asks for them.
    refresh: bool = False


def fleet_schedules(settings: ScheduleSettings) -> dict[str, Schedule]:
    def every(
        interval: timedelta, action: ScheduleActionStartWorkflow, paused: str = ""
    ) -> Schedule:
        return Schedule(
            action=action,
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
            # A run still going when the next is due (a slow node) makes the next one pointless.
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            state=ScheduleState(paused=bool(paused), note=paused),
        )

    refresh_paused = (
        ""
        if settings.refresh
        else "agents look and re-verify themselves (refresh_schedules: true runs this); "
        "trigger it to refresh every node now"
    )
    return {
        ENGINE_REVERIFY_SCHEDULE_ID: every(
            settings.reverify_every,
            ScheduleActionStartWorkflow(
                FleetRefreshWorkflow.run,
                NodeRefresh(engines=True),
                id=ENGINE_REVERIFY_WORKFLOW_ID,
                task_queue=CONTROL_TASK_QUEUE,
            ),
            paused=refresh_paused,
        ),
        INVENTORY_REFRESH_SCHEDULE_ID: every(
            settings.inventory_every,
            ScheduleActionStartWorkflow(
                FleetRefreshWorkflow.run,
                NodeRefresh(inventory=True),
                id=INVENTORY_REFRESH_WORKFLOW_ID,
                task_queue=CONTROL_TASK_QUEUE,
            ),
            paused=refresh_paused,
        ),
        SCHEDULED_ONBOARDING_SCHEDULE_ID: every(
            settings.onboarding_every,
            ScheduleActionStartWorkflow(
                ScheduledOnboardingWorkflow.run,
                id=SCHEDULED_ONBOARDING_WORKFLOW_ID,
                task_queue=CONTROL_TASK_QUEUE,
            ),
            paused="" if settings.onboarding else "no nodes_file in the configuration",
        ),
    }


async def ensure_schedules(client: Client, settings: ScheduleSettings) -> None:
    """Create each schedule, or replace an existing one's spec and action with the current
    configuration (so a changed interval applies on the next control worker start). Onboarding
    runs when a nodes file is configured; the refreshes are paused unless refresh_schedules is
    set (so those an older version created running are paused), and with it an operator's
    pause stands."""
    for schedule_id, schedule in fleet_schedules(settings).items():
        try:
            await client.create_schedule(schedule_id, schedule)
        except ScheduleAlreadyRunningError:

            def replace(
                now: ScheduleUpdateInput,
                wanted: Schedule = schedule,
                keep_state: bool = settings.refresh
                and schedule_id != SCHEDULED_ONBOARDING_SCHEDULE_ID,
            ) -> ScheduleUpdate:
                if keep_state:
                    # An operator's pause of a configured refresh stands.
                    wanted = dataclasses.replace(wanted, state=now.description.schedule.state)
                return ScheduleUpdate(schedule=wanted)

            await client.get_schedule_handle(schedule_id).update(replace)
