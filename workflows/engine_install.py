"""One engine on one node: fetch or build, verify by running, report. Progress travels as the
install activity's heartbeat details, which the Temporal UI and `llmgw nodes` show."""

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import EngineInstallRequest, EngineState, EngineStatus
    from workflows.names import NodeActivity, node_task_queue


@workflow.defn(name="EngineInstall")
class EngineInstallWorkflow:
    @workflow.run
    async def run(self, req: EngineInstallRequest) -> EngineStatus:
        try:
            status: EngineStatus = await workflow.execute_activity(
                NodeActivity.INSTALL_ENGINE,
                req,
                task_queue=node_task_queue(req.node),
                start_to_close_timeout=options.INSTALL_TIMEOUT,
                schedule_to_close_timeout=options.INSTALL_GIVE_UP,
                heartbeat_timeout=options.INSTALL_HEARTBEAT,
                retry_policy=options.INSTALL_RETRY,
                result_type=EngineStatus,
            )
            return status
        except ActivityError as err:
            cause = err.cause or err
            return EngineStatus(
                engine=req.requirement.engine,
                version=req.requirement.version,
                state=EngineState.FAILED,
                detail=f"install failed: {cause}",
            )
