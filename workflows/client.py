"""How every llmgw process talks to Temporal: one place that sets the data converter."""

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

DEFAULT_TEMPORAL_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"


async def connect(
    address: str = DEFAULT_TEMPORAL_ADDRESS, namespace: str = DEFAULT_NAMESPACE
) -> Client:
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter
    )
