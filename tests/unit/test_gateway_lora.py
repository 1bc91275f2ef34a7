"""LoRA adapters on the wire (gateway/lora.py): a llama.cpp replica applies an adapter only when
the request's `lora` field names it by its --lora index, which the route publishes in launch
order; vLLM and SGLang take it by name. Then the same through the gateway, over real sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.body_parse import upstream_payload
from gateway.errors import ApiError
from gateway.lora import (
    UpstreamBodies,
    adapter_index,
    base_body,
    ensure_adapter_served,
    lora_body,
    serves_adapter,
    unserved,
)
from gateway.request_body import ProxiedRequest
from workflows.contracts import ReplicaState, Route
from workflows.contracts.models import LoraAdapter, ModelSpec, Profile
from workflows.contracts.replicas import ReplicaCarried, ReplicaInput, ReplicaView
from workflows.replica.rules import replica_route

MESSAGES = [{"role": "user", "content": "hi"}]


def a_route(replica_id: str, engine: str = "llamacpp", adapters: list[str] | None = None) -> Route:
    return Route(
        replica_id=replica_id,
        model="smol",
        node="n1",
        endpoint="http://127.0.0.1:1",
        engine=engine,
        state=ReplicaState.READY,
        adapters=adapters or [],
    )


def a_request(adapter: str | None, body: dict[str, Any] | None = None) -> ProxiedRequest:
    body = body or {"model": adapter or "smol", "messages": MESSAGES}
    return ProxiedRequest("/v1/chat/completions", body, "smol", adapter, False, False, None)


# --- the route publishes its adapters in launch order --------------------------------------


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_a_replica_route_lists_its_profile_adapters_in_launch_order(engine: str) -> None:
    lora = [LoraAdapter(name="sql", path="/a/sql.gguf"), LoraAdapter(name="chat", path="/b.gguf")]
    spec = ModelSpec(name="smol", weights="/w.gguf", profiles=[Profile(engine=engine, lora=lora)])
    carried = ReplicaCarried(
        view=ReplicaView(replica_id="smol-0", model="smol", state=ReplicaState.READY)
    )
    route = replica_route(ReplicaInput(replica_id="smol-0", model=spec), carried, "n1", "h:1")
    assert route.adapters == ["sql", "chat"]
    assert route.engine == engine


def test_a_route_without_the_field_reads_as_no_adapters() -> None:
    old = a_route("r").model_dump()
    del old["adapters"]
    assert Route.model_validate(old).adapters == []


# --- pure parts ----------------------------------------------------------------------------


def test_the_index_is_the_adapters_place_in_launch_order() -> None:
    route = a_route("r", adapters=["sql", "chat"])
    assert adapter_index(route, "sql") == 0
    assert adapter_index(route, "chat") == 1
    assert adapter_index(route, "other") is None


def test_llamacpp_serves_only_the_adapters_it_loaded_by_name_engines_any() -> None:
    loaded = a_route("a", adapters=["sql"])
    bare = a_route("b")
    by_name = a_route("c", engine="vllm")
    assert serves_adapter(loaded, "sql")
    assert not serves_adapter(loaded, "chat")
    assert not serves_adapter(bare, "sql")
    assert serves_adapter(by_name, "anything")
    assert unserved([loaded, bare, by_name], "sql") == {"b"}
    assert unserved([loaded, bare, by_name], "chat") == {"a", "b"}
    assert unserved([loaded, bare], None) == set()


def test_a_vllm_replica_listing_adapters_is_chosen_only_for_those() -> None:
    """While a new adapter is loaded into a model's vLLM replicas one by one, its requests go
    to those that list it already, not to one that would answer 404."""
    updated = a_route("a", engine="vllm", adapters=["sql", "poem"])
    not_yet = a_route("b", engine="vllm", adapters=["sql"])
    assert unserved([updated, not_yet], "poem") == {"b"}
    assert unserved([updated, not_yet], "sql") == set()
    with pytest.raises(ApiError) as refused:
        ensure_adapter_served("smol", "gone", [updated, not_yet])
    assert refused.value.code == "adapter_not_found"


def test_an_adapter_no_ready_replica_loads_is_a_404_naming_it() -> None:
    with pytest.raises(ApiError) as refused:
        ensure_adapter_served("smol", "chat", [a_route("a", adapters=["sql"]), a_route("b")])
    assert refused.value.status == 404
    assert refused.value.code == "adapter_not_found"
    assert "'chat'" in str(refused.value.body())
    # Served somewhere, no adapter asked, or no ready replica (the 503/cold start path): no 404.
    ensure_adapter_served("smol", "sql", [a_route("a", adapters=["sql"]), a_route("b")])
    ensure_adapter_served("smol", "chat", [a_route("v", engine="vllm")])
    ensure_adapter_served("smol", None, [a_route("b")])
    ensure_adapter_served("smol", "chat", [])


def test_the_lora_field_applies_exactly_one_adapter_by_index() -> None:
    body = {"model": "smol:chat", "messages": MESSAGES}
    assert lora_body(body, 1) == {**body, "lora": [{"id": 1, "scale": 1.0}]}
    assert "lora" not in body  # the caller's body is not changed


def test_each_route_gets_its_own_body_built_once_per_index() -> None:
    request = a_request("chat", {"model": "chat", "messages": MESSAGES, "max_tokens": 5})
    payload = upstream_payload(request, b"", changed=True)
    bodies = UpstreamBodies(request, b"", payload)
    first = a_route("a", adapters=["sql", "chat"])
    second = a_route("b", adapters=["chat"])
    vllm = a_route("v", engine="vllm")

    assert bodies.for_route(vllm) is payload  # by name: the adapter's name as `model`
    at_1 = json.loads(bodies.for_route(first))
    assert at_1 == {
        "model": "smol:chat",
        "messages": MESSAGES,
        "max_tokens": 5,
        "lora": [{"id": 1, "scale": 1.0}],
    }
    assert json.loads(bodies.for_route(second))["lora"] == [{"id": 0, "scale": 1.0}]
    assert bodies.for_route(first) is bodies.for_route(first)
    with pytest.raises(ValueError, match="does not load adapter 'chat'"):
        bodies.for_route(a_route("c"))  # never chosen: `unserved` excludes it


def test_the_base_model_on_a_replica_loading_adapters_sets_them_all_to_zero() -> None:
    """llama-server applies every loaded adapter at scale 1.0 to a request without `lora`."""
    request = a_request(None)
    bodies = UpstreamBodies(request, b"raw", b"raw")
    assert bodies.for_route(a_route("a")) == b"raw"
    assert bodies.for_route(a_route("v", engine="vllm", adapters=["sql"])) == b"raw"
    sent = json.loads(bodies.for_route(a_route("b", adapters=["sql", "chat"])))
    assert sent == {**request.body, "lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]}
    assert base_body({"model": "smol"}, 1) == {"model": "smol", "lora": [{"id": 0, "scale": 0.0}]}


def test_a_split_large_body_keeps_its_bulk_and_gains_the_field() -> None:
    bulk = b'"messages":' + json.dumps(MESSAGES).encode()
    request = ProxiedRequest(
        "/v1/chat/completions", {"model": "sql"}, "smol", "sql", False, False, None, bulk=bulk
    )
    bodies = UpstreamBodies(request, b"", upstream_payload(request, b"", changed=True))
    sent = json.loads(bodies.for_route(a_route("a", adapters=["sql"])))
    assert sent == {"model": "smol:sql", "messages": MESSAGES, "lora": [{"id": 0, "scale": 1.0}]}
