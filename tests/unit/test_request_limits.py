"""Request-size limits, a key's prompt tokens in flight and the per-replica bound, as pure logic:
what is refused, with which status, and that the refusal names the limit and the field."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import ApiError
from gateway.key_inflight import KeyInFlight
from gateway.prompt_estimate import estimate_prompt_tokens
from gateway.request_limits import RequestLimits, check_request, prompt_count
from gateway.routing.queue_bound import full_replicas
from gateway.settings import GatewaySettings
from store import KeyLimits
from tests.gateway_kit import route

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
DEFAULTS = RequestLimits.effective(GatewaySettings(), KeyLimits())


def refusal(path: str, body: dict[str, Any], limits: RequestLimits = DEFAULTS) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_request(path, body, estimate_prompt_tokens(body), limits)
    return caught.value


def passes(path: str, body: dict[str, Any], limits: RequestLimits = DEFAULTS) -> bool:
    check_request(path, body, estimate_prompt_tokens(body), limits)
    return True


# --- prompts per request -------------------------------------------------------------------


def test_twenty_thousand_one_token_prompts_are_refused_naming_the_limit() -> None:
    # The body that kept a CPU llama-server busy for 3.5 minutes.
    body = {"model": "smol", "prompt": [[0]] * 20_000, "max_tokens": 1}
    err = refusal(COMPLETIONS, body)
    assert (err.status, err.param, err.code) == (400, "prompt", "max_prompts_per_request_exceeded")
    assert "20000 prompts" in err.message
    assert "max_prompts_per_request = 2048" in err.message


def test_an_embeddings_batch_as_large_as_openai_allows_passes_and_one_more_does_not() -> None:
    assert passes(EMBEDDINGS, {"model": "e", "input": ["otter"] * 2048})
    err = refusal(EMBEDDINGS, {"model": "e", "input": ["otter"] * 2049})
    assert (err.param, err.code) == ("input", "max_prompts_per_request_exceeded")


@pytest.mark.parametrize(
    ("value", "count"),
    [("one text", 1), ([1, 2, 3], 1), (["a", "b"], 2), ([[1, 2], [3]], 2)],
)
def test_a_prompt_counts_one_per_text_or_token_array(value: object, count: int) -> None:
    assert prompt_count(value) == count


# --- choices per request -------------------------------------------------------------------


@pytest.mark.parametrize("field", ["n", "best_of", "n_cmpl"])
def test_n_or_best_of_over_the_limit_is_refused_naming_the_field(field: str) -> None:
    limits = RequestLimits.effective(GatewaySettings(max_choices_per_request=4), KeyLimits())
    err = refusal(COMPLETIONS, {"model": "smol", "prompt": "hi", field: 5}, limits)
    assert (err.status, err.param, err.code) == (400, field, "max_choices_per_request_exceeded")
    assert passes(COMPLETIONS, {"model": "smol", "prompt": "hi", field: 4}, limits)


def test_n_on_a_chat_request_is_bounded_too() -> None:
    limits = RequestLimits.effective(GatewaySettings(max_choices_per_request=2), KeyLimits())
    messages = [{"role": "user", "content": "hi"}]
    err = refusal(CHAT, {"model": "smol", "messages": messages, "n": 3}, limits)
    assert (err.param, err.code) == ("n", "max_choices_per_request_exceeded")


def test_completions_count_every_prompt_times_its_choices() -> None:
    # 100 prompts pass the prompt limit, but each is a whole generation: 100 x 2 = 200 > 128.
    body = {"model": "smol", "prompt": ["hi"] * 100, "n": 2}
    err = refusal(COMPLETIONS, body)
    assert (err.param, err.code) == ("prompt", "max_choices_per_request_exceeded")
    assert "100 prompts x 2 choices each make 200 completions" in err.message
    # best_of above n is what the engine generates.
    assert refusal(COMPLETIONS, {"model": "smol", "prompt": ["hi"] * 64, "n": 1, "best_of": 3})
    assert passes(COMPLETIONS, {"model": "smol", "prompt": ["hi"] * 64, "n": 2})


def test_embeddings_inputs_are_not_choices() -> None:
    # One forward pass each, nothing generated: 2,048 inputs is within every default.
    assert passes(EMBEDDINGS, {"model": "e", "input": [[1, 2]] * 2048})


# --- estimated prompt tokens -----------------------------------------------------------------


def test_a_prompt_estimated_over_the_token_limit_is_refused() -> None:
    limits = RequestLimits.effective(
        GatewaySettings(max_prompt_tokens_per_request=1_000), KeyLimits()
    )
    messages = [{"role": "user", "content": "x" * 2_000}]
    err = refusal(CHAT, {"model": "smol", "messages": messages}, limits)
    assert (err.status, err.param) == (400, "messages")
    assert err.code == "max_prompt_tokens_per_request_exceeded"
    assert "max_prompt_tokens_per_request = 1000" in err.message
    short = [{"role": "user", "content": "x" * 500}]
    assert passes(CHAT, {"model": "smol", "messages": short}, limits)


def test_a_prompt_larger_than_the_keys_whole_in_flight_allowance_is_a_400_not_a_429() -> None:
    # A 429 would have the client retry something that can never fit.
    limits = RequestLimits.effective(GatewaySettings(max_inflight_prompt_tokens=100), KeyLimits())
    err = refusal(COMPLETIONS, {"model": "smol", "prompt": "x" * 200}, limits)
    assert (err.status, err.code) == (400, "max_inflight_prompt_tokens_exceeded")


# --- per-key overrides -------------------------------------------------------------------------


def test_a_key_can_be_given_more_or_less_than_the_gateway_default() -> None:
    settings = GatewaySettings(max_prompts_per_request=8)
    body = {"model": "smol", "prompt": ["hi"] * 10}
    assert refusal(COMPLETIONS, body, RequestLimits.effective(settings, KeyLimits()))
    raised = RequestLimits.effective(settings, KeyLimits(max_prompts_per_request=16))
    assert passes(COMPLETIONS, body, raised)
    lowered = RequestLimits.effective(settings, KeyLimits(max_prompts_per_request=2))
    err = refusal(COMPLETIONS, {"model": "smol", "prompt": ["hi"] * 3}, lowered)
    assert "max_prompts_per_request = 2" in err.message


def test_unset_key_fields_take_each_gateway_setting() -> None:
    settings = GatewaySettings(
        max_prompts_per_request=1,
        max_choices_per_request=2,
        max_prompt_tokens_per_request=3,
        max_inflight_prompt_tokens=4,
    )
    own = KeyLimits(max_choices_per_request=20, max_inflight_prompt_tokens=40)
    assert RequestLimits.effective(settings, own) == RequestLimits(1, 20, 3, 40)


# --- a key's prompt tokens in flight ---------------------------------------------------------


def test_a_key_past_its_tokens_in_flight_gets_429_with_retry_after() -> None:
    book = KeyInFlight()
    book.acquire("k1", 600, limit=1_000)
    with pytest.raises(ApiError) as caught:
        book.acquire("k1", 500, limit=1_000)
    err = caught.value
    assert (err.status, err.code) == (429, "max_inflight_prompt_tokens_exceeded")
    assert "max_inflight_prompt_tokens = 1000" in err.message
    assert int(err.headers["Retry-After"]) >= 1
    # Another key is not affected, and the refused request held nothing.
    book.acquire("k2", 500, limit=1_000)
    assert dict(book.tokens) == {"k1": 600, "k2": 500}


def test_tokens_in_flight_are_given_back_however_the_request_ends() -> None:
    book = KeyInFlight()
    with book.held("k1", 600, limit=1_000):
        assert book.tokens["k1"] == 600
    with pytest.raises(RuntimeError), book.held("k1", 900, limit=1_000):
        raise RuntimeError("the engine failed")
    assert dict(book.tokens) == {}
    with book.held("k1", 1_000, limit=1_000):  # the whole allowance, once free again
        pass


# --- the per-replica bound --------------------------------------------------------------------


def test_a_replica_at_its_bound_is_full_and_one_below_is_not() -> None:
    routes = [route("smol-0", "http://a"), route("smol-1", "http://b"), route("smol-2", "http://c")]
    inflight = {"smol-0": 2, "smol-1": 1}
    assert full_replicas(routes, inflight, limit=2) == {"smol-0"}
    assert full_replicas(routes, inflight, limit=1) == {"smol-0", "smol-1"}
    assert full_replicas(routes, {}, limit=1) == set()
