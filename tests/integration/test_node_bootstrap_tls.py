"""`llmgw node bootstrap` trusts the control plane through the CA it is given: its checks reach a
real Temporal behind a proxy demanding mutual TLS (tests/tls_kit.py) with the CA, client
certificate and server name from its flags, and a CA that did not sign the server's certificate
is refused as unreachable, before anything is written.

What this does not show: a node workflow answering over TLS (no control worker runs here, so
the node is not found, which is the refusal a reachable control plane gives for an unknown
node), nor the agent then started with the copied files.
"""

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.tls_kit import Issued, MutualTLSProxy, TestCA
from workers.cli import build_parser, locations
from workers.commands.node_bootstrap.command import Refused, checked_request
from workers.join import JoinToken
from workers.temporal_server import temporal_binary

pytestmark = pytest.mark.integration

SERVER_NAME = "temporal.llmgw.internal"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
async def proxy(ca: TestCA) -> AsyncIterator[MutualTLSProxy]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        dev_server_startup_timeout=timedelta(seconds=60),
    )
    server = ca.issue("temporal-frontend", server_names=[SERVER_NAME])
    upstream = env.client.service_client.config.target_host
    try:
        async with MutualTLSProxy(upstream=upstream, server=server, client_ca=ca.cert_file) as made:
            yield made
    finally:
        await env.shutdown()


async def refusal(argv: list[str]) -> str:
    args = build_parser().parse_args(["node", "bootstrap", "--dry-run", *argv])
    with pytest.raises(Refused) as refused:
        await checked_request(args, locations(args))
    return str(refused.value)


async def test_bootstrap_reaches_the_control_plane_through_the_ca_it_is_given(
    proxy: MutualTLSProxy, ca: TestCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LLMGW_TEMPORAL_ADDRESS", "LLMGW_TEMPORAL_TLS_CA", "LLMGW_TEMPORAL_TLS_CERT",
                 "LLMGW_TEMPORAL_TLS_KEY", "LLMGW_TEMPORAL_TLS_SERVER_NAME"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    client: Issued = ca.issue("llmgw-node")
    token = JoinToken("tls-n1", proxy.address, b"\x05" * 32).encode()
    mutual = [
        "--join", token, "--temporal-tls-cert", str(client.cert),
        "--temporal-tls-key", str(client.key), "--temporal-tls-server-name", SERVER_NAME,
    ]  # fmt: skip

    # Through TLS to the server, which has no such node: the refusal of a reachable cluster.
    trusted = await refusal([*mutual, "--temporal-tls-ca", str(ca.cert_file)])
    assert "has no node 'tls-n1'" in trusted, trusted
    assert proxy.clients == ["llmgw-node"]

    other = TestCA(tmp_path, name="another CA")
    untrusted = await refusal([*mutual, "--temporal-tls-ca", str(other.cert_file)])
    assert "cannot reach the control plane's Temporal" in untrusted, untrusted
    assert "UnknownIssuer" in untrusted, untrusted
