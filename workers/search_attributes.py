"""Registering llmgw's search attributes on the namespace: a workflow that sets one the
namespace does not know fails its task, so this runs before the control worker starts."""

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workflows.search_attributes import ALL

log = logging.getLogger("llmgw.control")


async def ensure_search_attributes(client: Client) -> None:
    try:
        known = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        existing = set(known.custom_attributes)
    except RPCError as err:
        # Temporal's time-skipping test server cannot list them; adding works there.
        if err.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        existing = set()
    missing = {
        key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
        for key in ALL
        if key.name not in existing
    }
    if not missing:
        return
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    except RPCError as err:
        # Another control worker registered them first.
        if err.status != RPCStatusCode.ALREADY_EXISTS:
            raise
    log.info("registered search attributes %s", ", ".join(sorted(missing)))
