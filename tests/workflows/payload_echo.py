"""A workflow and activity that carry a model definition both ways, for the payload codec's
test (test_payload_encryption.py): kept in a module of their own, which the sandbox imports."""

from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import ModelSpec


@activity.defn(name="payload_echo")
async def payload_echo(spec: ModelSpec) -> ModelSpec:
    return spec.model_copy(update={"name": spec.name + "-seen"})


@workflow.defn(name="PayloadEcho")
class PayloadEcho:
    @workflow.run
    async def run(self, spec: ModelSpec) -> ModelSpec:
        return await workflow.execute_activity(
            payload_echo, spec, start_to_close_timeout=timedelta(seconds=30)
        )
