"""Search attributes replicas carry, so an operator can find them in the Temporal UI and CLI:
`temporal workflow list --query "LlmgwModel = 'llama-70b' AND LlmgwReplicaState = 'pending'"`.

They must be registered on the namespace before a workflow sets them (the control worker does
it at start); each is a keyword: exact match, cheap to index.
"""

from temporalio.common import SearchAttributeKey

MODEL = SearchAttributeKey.for_keyword("LlmgwModel")
NODE = SearchAttributeKey.for_keyword("LlmgwNode")
REPLICA_STATE = SearchAttributeKey.for_keyword("LlmgwReplicaState")

ALL = (MODEL, NODE, REPLICA_STATE)
