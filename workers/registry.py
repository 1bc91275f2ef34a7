"""Which workflows each worker hosts."""

from workflows.artifact_fetch import ArtifactFetchWorkflow
from workflows.engine_install import EngineInstallWorkflow
from workflows.fleet import FleetRefreshWorkflow, ScheduledOnboardingWorkflow
from workflows.model.workflow import ModelWorkflow
from workflows.node.workflow import NodeWorkflow
from workflows.replica.workflow import ReplicaWorkflow

CONTROL_WORKFLOWS = [
    NodeWorkflow,
    EngineInstallWorkflow,
    ModelWorkflow,
    ReplicaWorkflow,
    FleetRefreshWorkflow,
    ScheduledOnboardingWorkflow,
    ArtifactFetchWorkflow,
]
