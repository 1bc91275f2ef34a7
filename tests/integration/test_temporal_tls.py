"""llmgw's processes reach a real Temporal through mutual TLS, in a namespace of their own.

`temporal server start-dev` cannot serve TLS, so the dev server sits behind a TLS proxy that
demands a client certificate (tests/tls_kit.py). What this proves: the client settings as the CLI
builds them (flags and variables, workers/temporal_flags.py) give a TLS handshake that a server
requiring mTLS accepts, with the CA, client certificate and server-name override honoured, and
that workers poll and complete workflows through it. What it does not: a Temporal server's own TLS
configuration, or an API key checked by a server (the dev server checks none).
"""

import argparse
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.tls_kit import Issued, MutualTLSProxy, TestCA
from workers.cli import build_parser, locations
from workers.connect import connect_with_retry
from workers.paths import Locations
from workers.search_attributes import ensure_search_attributes
from workers.temporal_server import temporal_binary
from workflows.client import connect
from workflows.search_attributes import ALL

pytestmark = pytest.mark.integration

NAMESPACE = "llmgw-tls-test"
SERVER_NAME = "temporal.llmgw.internal"
MAKE_CERTS = (
    Path(__file__).resolve().parents[2] / "deploy" / "make-certs.sh"
)  # the only name on the server's certificate


@workflow.defn(sandboxed=False)
class Echo:
    @workflow.run
    async def run(self, text: str) -> str:
        return f"echo {text}"


@pytest.fixture(scope="module")
async def dev_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        dev_server_startup_timeout=timedelta(seconds=60),
        dev_server_extra_args=["--namespace", NAMESPACE],
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def client_cert(ca: TestCA) -> Issued:
    return ca.issue("llmgw-control")


@pytest.fixture
async def proxy(dev_server: WorkflowEnvironment, ca: TestCA) -> AsyncIterator[MutualTLSProxy]:
    server = ca.issue("temporal-frontend", server_names=[SERVER_NAME])
    address = dev_server.client.service_client.config.target_host
    async with MutualTLSProxy(upstream=address, server=server, client_ca=ca.cert_file) as made:
        yield made


@pytest.fixture(autouse=True)
def no_temporal_settings_around(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it means; none leak in from the shell running the tests."""
    for name in [n for n in os.environ if n.startswith("LLMGW_TEMPORAL_")]:
        monkeypatch.delenv(name)


def cli_locations(argv: list[str]) -> Locations:
    """Locations as `llmgw` builds them for a command line and the environment."""
    args: argparse.Namespace = build_parser().parse_args(argv)
    return locations(args)


async def test_a_worker_serves_workflows_over_mutual_tls_in_its_namespace(
    proxy: MutualTLSProxy, ca: TestCA, client_cert: Issued, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The address from a flag, the rest from variables, as the systemd env file gives them.
    monkeypatch.setenv("LLMGW_TEMPORAL_TLS_CERT", str(client_cert.cert))
    monkeypatch.setenv("LLMGW_TEMPORAL_TLS_KEY", str(client_cert.key))
    monkeypatch.setenv("LLMGW_TEMPORAL_TLS_SERVER_NAME", SERVER_NAME)
    argv = ["control", "--temporal", proxy.address, "--temporal-namespace", NAMESPACE]
    where = cli_locations([*argv, "--temporal-tls-ca", str(ca.cert_file)])

    client = await connect_with_retry(where, attempts=1)
    assert client.namespace == NAMESPACE
    # What `llmgw control` does first on a cluster: register its search attributes.
    await ensure_search_attributes(client)
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[Echo]):
        result = await client.execute_workflow(
            Echo.run, "over mTLS", id=f"echo-{queue}", task_queue=queue
        )
    assert result == "echo over mTLS"
    assert set(proxy.clients) == {"llmgw-control"}

    # The workflow and the attributes are in that namespace of the real server, not in default.
    plain: Client = await connect(proxy.upstream, namespace=NAMESPACE)
    described = await plain.get_workflow_handle(f"echo-{queue}").describe()
    assert described.status == WorkflowExecutionStatus.COMPLETED
    names = await ensure_registered_names(plain)
    assert {key.name for key in ALL} <= names


async def ensure_registered_names(client: Client) -> set[str]:
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest

    known = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return set(known.custom_attributes)


async def test_a_client_without_its_certificate_is_turned_away(
    proxy: MutualTLSProxy, ca: TestCA
) -> None:
    argv = ["status", "--temporal", proxy.address, "--temporal-namespace", NAMESPACE]
    argv += ["--temporal-tls-ca", str(ca.cert_file), "--temporal-tls-server-name", SERVER_NAME]
    where = cli_locations(argv)
    with pytest.raises(RuntimeError):
        await connect_with_retry(where, attempts=1)
    assert proxy.clients == []


async def test_the_server_certificate_is_checked_against_the_given_ca_and_name(
    proxy: MutualTLSProxy,
    ca: TestCA,
    client_cert: Issued,
    tmp_path: Path,
) -> None:
    mutual = [
        "--temporal-tls-cert",
        str(client_cert.cert),
        "--temporal-tls-key",
        str(client_cert.key),
    ]
    base = ["status", "--temporal", proxy.address, "--temporal-namespace", NAMESPACE, *mutual]
    other_ca = TestCA(tmp_path, name="another CA")
    wrong_ca = [*base, "--temporal-tls-ca", str(other_ca.cert_file)]
    # The certificate names SERVER_NAME only, not the 127.0.0.1 the address has.
    no_name = [*base, "--temporal-tls-ca", str(ca.cert_file)]
    for argv, why in ((wrong_ca, "UnknownIssuer"), (no_name, "NotValidForName")):
        with pytest.raises(RuntimeError, match=why):
            await connect_with_retry(cli_locations(argv), attempts=1)
    assert proxy.clients == []


async def test_the_certificates_deploy_makes_carry_a_worker_over_mutual_tls(
    dev_server: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/make-certs.sh, as docs/operations.md runs it, makes certificates the client
    accepts: Temporal's names the server `temporal` (dialled at 127.0.0.1), llmgw's is taken by
    a server requiring its CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: deploy/make-certs.sh needs it")
    made = tmp_path / "tls"
    subprocess.run([str(MAKE_CERTS), str(made), "10.0.0.1"], check=True, capture_output=True)
    assert not (made / "ca.key").exists()  # the CA's key stays apart from what services mount
    server = Issued(made / "temporal.pem", made / "temporal.key")
    upstream = dev_server.client.service_client.config.target_host
    async with MutualTLSProxy(upstream=upstream, server=server, client_ca=made / "ca.pem") as tls:
        monkeypatch.setenv("LLMGW_TEMPORAL_TLS_CA", str(made / "ca.pem"))
        monkeypatch.setenv("LLMGW_TEMPORAL_TLS_CERT", str(made / "llmgw.pem"))
        monkeypatch.setenv("LLMGW_TEMPORAL_TLS_KEY", str(made / "llmgw.key"))
        monkeypatch.setenv("LLMGW_TEMPORAL_TLS_SERVER_NAME", "temporal")
        argv = ["agent", "--temporal", tls.address, "--temporal-namespace", NAMESPACE]
        client = await connect_with_retry(cli_locations(argv), attempts=1)
        queue = f"certs-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=queue, workflows=[Echo]):
            result = await client.execute_workflow(
                Echo.run, "made certs", id=f"echo-{queue}", task_queue=queue
            )
    assert result == "echo made certs"
    assert set(tls.clients) == {"llmgw"}


async def test_an_api_key_from_its_file_rides_along_over_tls(
    proxy: MutualTLSProxy, ca: TestCA, client_cert: Issued, tmp_path: Path
) -> None:
    """The dev server checks no API key, so this shows what the client was given and that a
    connection carrying one works over TLS, not that a server accepted the key."""
    key_file = tmp_path / "temporal-api-key"
    key_file.write_text("tc-test-key-0123\n")
    key_file.chmod(0o600)
    argv = ["status", "--temporal", proxy.address, "--temporal-namespace", NAMESPACE]
    argv += ["--temporal-tls-ca", str(ca.cert_file), "--temporal-tls-server-name", SERVER_NAME]
    argv += ["--temporal-tls-cert", str(client_cert.cert)]
    argv += ["--temporal-tls-key", str(client_cert.key)]
    argv += ["--temporal-api-key-file", str(key_file)]
    client = await connect_with_retry(cli_locations(argv), attempts=1)
    assert client.api_key == "tc-test-key-0123"
    await client.count_workflows()  # a call with the key attached gets through (or raises)
    assert proxy.clients == ["llmgw-control"]
