"""How every llmgw process talks to Temporal: one place that sets the data converter (pydantic,
with payloads encrypted when a payload key is configured: workflows/payload_codec.py) and the
connection's security (TLS, mutual TLS, API key: workflows/temporal_security.py), and
Temporal's tracing interceptor when the process traces (workflows/otel.py)."""

import dataclasses

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter

from workflows import otel
from workflows.payload_codec import EncryptionCodec, PayloadKeys
from workflows.temporal_security import TemporalSecurity

DEFAULT_TEMPORAL_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"
PLAINTEXT = TemporalSecurity()


async def connect(
    address: str = DEFAULT_TEMPORAL_ADDRESS,
    namespace: str = DEFAULT_NAMESPACE,
    security: TemporalSecurity = PLAINTEXT,
) -> Client:
    # Read here, at each connect, and passed to the client only: a key never sits in a setting
    # that a log line or a workflow input could carry.
    return await Client.connect(
        address,
        namespace=namespace,
        data_converter=data_converter(security.payload_keys()),
        tls=security.tls_config(),
        api_key=security.api_key(),
        # Temporal's tracing interceptor, once this process traces (workflows/otel.py).
        interceptors=otel.temporal_interceptors(),
    )


def data_converter(keys: PayloadKeys | None) -> DataConverter:
    """Pydantic payloads, sealed with `keys`. Without keys the codec seals nothing but still
    names the missing key when it meets an encrypted payload, rather than Temporal's "unknown
    encoding"."""
    return dataclasses.replace(pydantic_data_converter, payload_codec=EncryptionCodec(keys))
