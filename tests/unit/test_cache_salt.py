"""A key's prefix-cache salt (gateway/cache_salt.py): how it is derived, when a body gets it,
how a client's own salt is kept under it, and what the router's byte index sees of it."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.body_parse import prepare, upstream_payload
from gateway.cache_salt import CacheSalts, isolates, salt_body, salted_prompt
from gateway.errors import ApiError
from gateway.request_body import CHAT, MAX_CACHE_SALT
from gateway.routing import PrefixIndex
from store import ApiKey, KeyLimits
from workflows.contracts import ReplicaState, Route
from workflows.engine_keys import cache_salt_from_master

MASTER = bytes(range(32))


def key(key_id: str = "0a1b2c3d", isolate: bool = True) -> ApiKey:
    return ApiKey(
        key_id=key_id,
        name=f"k-{key_id}",
        key_hash="0" * 64,
        limits=KeyLimits(isolate_cache=isolate),
        created_at=datetime.now(UTC),
    )


def route(replica_id: str, engine: str = "vllm") -> Route:
    return Route(
        replica_id=replica_id,
        model="m",
        node="node-a",
        endpoint="http://127.0.0.1:1",
        engine=engine,
        state=ReplicaState.READY,
    )


def test_a_keys_salt_is_an_hmac_of_its_id_under_the_master_secret() -> None:
    salt = cache_salt_from_master(MASTER, "0a1b2c3d")
    assert salt == hmac.new(MASTER, b"cache-salt:0a1b2c3d", hashlib.sha256).hexdigest()
    assert len(salt) == 64
    assert cache_salt_from_master(MASTER, "0a1b2c3e") != salt, "another key, another salt"
    assert cache_salt_from_master(bytes(32), "0a1b2c3d") != salt, "another install, another salt"
    salts = CacheSalts(MASTER)
    assert salts.for_key("0a1b2c3d") == salts.for_key("0a1b2c3d") == salt


@pytest.mark.parametrize(
    ("isolate", "engines", "expected"),
    [
        (True, ["vllm"], True),
        (True, ["vllm", "vllm"], True),
        (False, ["vllm"], False),
        (True, ["vllm", "llamacpp"], False),  # a retry could land on the one that is not
        (True, ["sglang"], False),
        (True, ["external"], False),
        (True, [], False),
    ],
)
def test_only_an_isolated_key_on_vllm_replicas_only_is_salted(
    isolate: bool, engines: list[str], expected: bool
) -> None:
    routes = [route(f"r{n}", engine) for n, engine in enumerate(engines)]
    assert isolates(key(isolate=isolate), routes) is expected
    body: dict[str, Any] = {"model": "m"}
    salt = salt_body(CacheSalts(MASTER), key(isolate=isolate), body, routes)
    assert (salt is not None) is expected
    assert body.get("cache_salt") == salt


def test_a_clients_salt_goes_after_the_keys() -> None:
    derived = cache_salt_from_master(MASTER, "0a1b2c3d")
    body: dict[str, Any] = {"model": "m", "cache_salt": "team-1"}
    assert salt_body(CacheSalts(MASTER), key(), body, [route("r")]) == f"{derived}:team-1"
    assert body["cache_salt"] == f"{derived}:team-1"
    # A client that sends another key's salt only divides its own cache with it.
    other = cache_salt_from_master(MASTER, "ffffffff")
    body = {"model": "m", "cache_salt": other}
    assert salt_body(CacheSalts(MASTER), key(), body, [route("r")]) == f"{derived}:{other}"


def test_a_client_salt_with_no_room_for_the_keys_is_refused_naming_the_field() -> None:
    room = MAX_CACHE_SALT - 65  # the key's 64 hex digits and a colon
    body: dict[str, Any] = {"model": "m", "cache_salt": "x" * room}
    salt = salt_body(CacheSalts(MASTER), key(), body, [route("r")])
    assert salt is not None
    assert len(salt) == MAX_CACHE_SALT
    with pytest.raises(ApiError) as caught:
        salt_body(CacheSalts(MASTER), key(), {"cache_salt": "x" * (room + 1)}, [route("r")])
    assert (caught.value.status, caught.value.param) == (400, "cache_salt")
    assert f"at most {room} characters" in caught.value.message
    # The same salt under a key without isolation goes to the engine as it is.
    assert salt_body(CacheSalts(MASTER), key(isolate=False), body, [route("r")]) is None


def test_the_routing_prompt_keeps_each_salt_apart() -> None:
    prompt = b"a long shared system prompt " * 40
    index = PrefixIndex()
    assert salted_prompt(prompt, None) is prompt
    a = index.hashes(salted_prompt(prompt, "salt-a"))
    b = index.hashes(salted_prompt(prompt, "salt-b"))
    assert a == index.hashes(salted_prompt(prompt, "salt-a"))
    assert not set(a) & set(b), "no block of one salt's prompt is another's"
    assert not set(a) & set(index.hashes(prompt))


def test_a_split_large_body_keeps_the_salt_among_its_small_fields() -> None:
    # A body parsed in a worker keeps only its small fields in `body`: the salt must be one of
    # them, or the rewritten salt and the client's would both go upstream.
    salt = "s" * MAX_CACHE_SALT
    raw = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}], "cache_salt": salt}
    ).encode()
    prepared = prepare(CHAT, raw, split=True)
    assert prepared.request is not None
    request = prepared.request
    assert request.bulk is not None
    assert request.body["cache_salt"] == salt
    request.body["cache_salt"] = "team"  # shorter, so the key's salt fits in front
    new = salt_body(CacheSalts(MASTER), key(), request.body, [route("r")])
    payload = upstream_payload(request, raw, changed=True)
    assert payload.count(b'"cache_salt"') == 1
    assert json.loads(payload)["cache_salt"] == new
