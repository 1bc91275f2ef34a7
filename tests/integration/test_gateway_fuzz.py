"""Fuzzing the running gateway from its own description, gateway/openapi.yaml: every operation,
with requests schemathesis derives from the schema (valid ones, and ones that break it on
purpose: those must be refused with a 4xx), against a real server in its own process,
a valid key and a healthy upstream. Nothing the gateway is sent may make it fail (5xx): with
a ready replica that answers everything, even 502/503 would be a defect.

Bounded and repeatable: a fixed number of examples per operation, derandomized, well under a
minute in all."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from tests.gateway_kit import (
    MODEL,
    GatewayProcess,
    recording_standin_thread,
    start_gateway_process,
)

SPEC = Path(__file__).resolve().parents[2] / "gateway" / "openapi.yaml"
EXAMPLES_PER_OPERATION = 40
PROXIED = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}

schema = schemathesis.openapi.from_path(SPEC)
schema.config.generation.update(max_examples=EXAMPLES_PER_OPERATION, deterministic=True)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    state_dir = tmp_path_factory.mktemp("fuzz")
    with recording_standin_thread(state_dir) as upstream:
        proc = start_gateway_process(state_dir, upstream.url)
        yield proc
        proc.stop()


def test_the_spec_names_every_operation_the_gateway_serves() -> None:
    labels = {op.ok().label for op in schema.get_all_operations() if isinstance(op, Ok)}
    assert labels == {
        "GET /v1/models",
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/embeddings",
        "GET /admin/v1/routes",
        "GET /admin/v1/kv",
        "GET /admin/v1/models",
        "PUT /admin/v1/models/{name}",
        "GET /admin/v1/usage",
        "GET /admin/v1/keys",
        "POST /admin/v1/keys",
        "DELETE /admin/v1/keys/{name_or_id}",
        "PUT /admin/v1/keys/{name_or_id}/limits",
        "PUT /admin/v1/models/{model}/upstream-key",
        "DELETE /admin/v1/models/{model}/upstream-key",
        "GET /admin/v1/console",
        "GET /admin/v1/requests",
        "GET /admin/v1/series",
        "POST /admin/v1/nodes/{name}/{action}",
        "POST /admin/v1/models/{name}/scale",
        "POST /admin/v1/imports/ollama",
        "GET /admin/v1/playground/models",
        "POST /admin/v1/playground/chat/completions",
    }


@schema.parametrize()
def test_no_request_valid_or_not_is_a_server_error(
    case: schemathesis.Case[Any], gateway: GatewayProcess
) -> None:
    body = case.body
    # Random model names all end in 404; every other example names the served model, so the
    # fuzzed fields go through routing, the upstream hop and the relay.
    if (
        case.path in PROXIED
        and isinstance(body, dict)
        and zlib.crc32(repr(sorted(body)).encode()) % 2 == 0
    ):
        body["model"] = MODEL
    # Changes go as application/json, bodiless DELETEs too, as the `llmgw` CLI sends them.
    headers = {**gateway.auth, "Content-Type": "application/json"}
    case.call_and_validate(base_url=gateway.url, headers=headers, checks=[not_a_server_error])
