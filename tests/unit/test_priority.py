"""A request's priority class from its header or body, checked against its key's top class."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admission.priority import request_priority
from gateway.errors import ApiError


def asked(
    header: bytes | None = None, body: dict[str, Any] | None = None, top: Any = "interactive"
) -> int:
    return request_priority(header, body if body is not None else {}, top)


def test_none_asked_is_standard_or_the_keys_top_if_lower() -> None:
    assert asked() == 2
    assert asked(top="batch") == 3


def test_names_and_numbers_in_the_body_or_header() -> None:
    assert asked(body={"priority": "batch"}) == 3
    assert asked(body={"priority": 1}) == 1
    assert asked(header=b"interactive") == 1
    assert asked(header=b" 3 ") == 3


def test_the_field_is_taken_out_of_the_body() -> None:
    body = {"model": "m", "priority": "batch"}
    asked(body=body)
    assert body == {"model": "m"}


@pytest.mark.parametrize("value", [7, -1, "urgent", 1.5, True, [1]])
def test_a_priority_out_of_range_or_unknown_is_a_400_naming_the_field(value: object) -> None:
    with pytest.raises(ApiError) as err:
        asked(body={"priority": value})
    assert err.value.status == 400
    assert err.value.param == "priority"
    assert err.value.code == "invalid_priority"


def test_above_the_keys_top_class_is_a_400() -> None:
    with pytest.raises(ApiError) as err:
        asked(header=b"critical")
    assert err.value.status == 400
    assert err.value.code == "priority_not_allowed"
    assert err.value.param == "x-llmgw-priority"
    assert asked(header=b"critical", top="critical") == 0


def test_only_vllm_started_for_priorities_takes_them() -> None:
    from workflows.contracts import Profile

    assert Profile(engine="vllm", args=["--scheduling-policy", "priority"]).takes_priority
    assert Profile(engine="vllm", args=["--scheduling-policy=priority"]).takes_priority
    assert not Profile(engine="vllm").takes_priority, (
        "vLLM refuses `priority` unless started for it"
    )
    assert not Profile(engine="vllm", args=["--scheduling-policy", "fcfs"]).takes_priority
    assert not Profile(engine="llamacpp", args=["--scheduling-policy", "priority"]).takes_priority


def test_a_llamacpp_profile_gives_its_slots_and_others_none() -> None:
    from workflows.contracts import Profile

    assert Profile(parallel=3).slots == 3
    assert Profile(parallel=3, args=["-np", "5"]).slots == 5
    assert Profile(engine="vllm", parallel=3).slots is None
