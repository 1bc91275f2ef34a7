"""Names of messages one workflow sends another where the sender cannot name the receiver's
handler method (`handle.signal(ModelWorkflow.replace, ...)`) without an import cycle. The
receiver declares its handler with the same constant, so the two cannot drift apart.

Never rename a value: the name is what running workflows and stored histories recorded.
"""

# A replica tells its model it serves (workflows/replica/workflow.py ->
# ModelWorkflow.replica_ready): the model's workflow imports the replica's for its child
# workflows, so the replica's cannot import the model's.
MODEL_REPLICA_READY = "replica_ready"

# A node's fetch tells each workflow waiting on it how it ended (workflows/artifact_fetch.py ->
# ReplicaWorkflow.artifact_fetched): the replica workflow is the fetch's caller, not a module it
# imports.
ARTIFACT_FETCHED = "artifact_fetched"
