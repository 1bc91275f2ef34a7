"""What the gateway refuses before anything reaches an engine, and what it reads of a body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import ApiError
from gateway.json_body import parse_json_object
from gateway.request_body import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    parse_proxied_request,
)

CHAT_BODY = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}


def refused(path: str, body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_proxied_request(path, body)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    "field",
    [
        "api_base",
        "base_url",
        "api_key",
        "headers",
        "extra_headers",
        # the engines' disaggregation fields: where a KV cache is sent or fetched from
        "bootstrap_host",
        "bootstrap_port",
        "kv_transfer_params",
        "disaggregated_params",
    ],
)
def test_fields_that_would_redirect_a_request_are_refused(field: str) -> None:
    error = refused(CHAT, {**CHAT_BODY, field: "http://169.254.169.254/"})
    assert error.param == field
    assert error.code == "unsupported_field"


def test_a_lora_field_is_refused_so_no_key_applies_an_adapter_it_is_not_granted() -> None:
    # llama-server would apply any loaded adapter named by id in `lora`, past the allowlist.
    error = refused(COMPLETIONS, {"model": "m", "prompt": "hi", "lora": [{"id": 0, "scale": 1}]})
    assert error.param == "lora"
    assert error.code == "unsupported_field"
    assert "'model': '<model>:<adapter>'" in error.message


@pytest.mark.parametrize(
    ("field", "value"),
    [("lora_path", "/models/other-tenant"), ("lora_request", {"lora_int_id": 1})],
)
def test_the_engines_own_adapter_fields_are_refused(field: str, value: object) -> None:
    # SGLang loads what lora_path names; TensorRT-LLM what lora_request describes.
    error = refused(CHAT, {**CHAT_BODY, field: value})
    assert error.param == field
    assert error.code == "unsupported_field"


def test_code_for_an_engine_to_run_is_refused() -> None:
    # SGLang started with --enable-custom-logit-processor runs the serialised Python it is sent.
    error = refused(CHAT, {**CHAT_BODY, "custom_logit_processor": "gASVKAAAAAAAAAB9lC4="})
    assert error.param == "custom_logit_processor"
    assert error.code == "unsupported_field"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("max_tokens", 10_000_000),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("max_tokens", "100"),
        ("n", 0),
        ("n", 129),
        ("top_logprobs", 21),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 1.5),
        ("presence_penalty", 3),
    ],
)
def test_numbers_out_of_range_name_the_field(field: str, value: object) -> None:
    error = refused(CHAT, {**CHAT_BODY, field: value})
    assert error.param == field
    assert field in error.message


def test_numbers_in_range_pass_untouched() -> None:
    body = {**CHAT_BODY, "max_tokens": 16, "n": 2, "temperature": 0.7, "top_p": 1, "seed": -1}
    parsed = parse_proxied_request(CHAT, dict(body))
    assert parsed.body == body


def test_of_several_fields_out_of_range_the_first_in_the_table_is_named() -> None:
    # The body's own order does not decide: the table's does (gateway/body_fields.py).
    body = {**CHAT_BODY, "top_k": -5, "n_probs": 99, "temperature": 9, "max_tokens": 0}
    assert refused(CHAT, body).param == "max_tokens"
    del body["max_tokens"]
    assert refused(CHAT, body).param == "temperature"
    del body["temperature"]
    assert refused(CHAT, body).param == "n_probs"


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        # The hostile client's cases: llama.cpp reads n_predict before max_tokens.
        (CHAT, "n_predict", -1),
        (CHAT, "n_predict", 1e9),
        (CHAT, "n_predict", 1_000_000_000),
        (CHAT, "n_predict", 0),
        (COMPLETIONS, "n_probs", 1_000_000),
        (COMPLETIONS, "n_probs", -1),
        (COMPLETIONS, "prompt_logprobs", -1),
        (COMPLETIONS, "n_cmpl", 0),
        (COMPLETIONS, "n_cmpl", 1000),
        (CHAT, "min_tokens", -1),
        (CHAT, "min_tokens", 10_000_000),
        (CHAT, "n_keep", -2),
        (CHAT, "n_discard", -5),
        (CHAT, "repeat_last_n", -100),
        (CHAT, "dry_penalty_last_n", 2**40),
        (CHAT, "truncate_prompt_tokens", -2),
        (CHAT, "top_k", -2),
        (CHAT, "min_keep", 10**12),
        (CHAT, "speculative.n_max", 1_000_000),
        (CHAT, "max_dynamic_patch", 10_000),
        (CHAT, "t_max_predict_ms", -1),
        (CHAT, "thinking_token_budget", 1e12),
        (CHAT, "n_indent", "8"),
    ],
)
def test_engine_native_lengths_and_counts_out_of_range_name_the_field(
    path: str, field: str, value: object
) -> None:
    body = {"model": "smol", "prompt": "x", "messages": CHAT_BODY["messages"], "max_tokens": 1}
    error = refused(path, {**body, field: value})
    assert error.param == field
    assert f"'{field}'" in error.message


def test_engine_native_fields_in_range_pass_untouched() -> None:
    body = {
        **CHAT_BODY,
        "n_predict": 16,
        "n_probs": 5,
        "n_keep": -1,
        "repeat_last_n": -1,
        "top_k": 40,
        "min_tokens": 2,
        "truncate_prompt_tokens": -1,
        "speculative.n_max": 16,
    }
    assert parse_proxied_request(CHAT, dict(body)).body == body


@pytest.mark.parametrize("field", ["input_ids", "prompt_embeds"])
def test_a_prompt_in_a_form_the_gateway_does_not_count_is_refused(field: str) -> None:
    # SGLang takes token ids in place of the messages, vLLM embedding tensors: neither is
    # seen by the prompt estimate, the request limits or the reservation.
    error = refused(CHAT, {**CHAT_BODY, field: [1] * 10})
    assert error.param == field
    assert error.code == "unsupported_field"


@pytest.mark.parametrize("logprobs", [-1, 21, True, "5"])
def test_completion_logprobs_are_an_integer_from_0_to_20(logprobs: object) -> None:
    error = refused(COMPLETIONS, {"model": "smol", "prompt": "x", "logprobs": logprobs})
    assert error.param == "logprobs"


def test_chat_logprobs_are_a_boolean() -> None:
    assert refused(CHAT, {**CHAT_BODY, "logprobs": 5}).param == "logprobs"
    assert parse_proxied_request(CHAT, {**CHAT_BODY, "logprobs": True}).model == "smol"


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "/etc/passwd", "FILE:///root/.ssh/id_rsa", "s3://bucket/x"]
)
def test_media_by_local_path_is_refused(url: str) -> None:
    body = {
        "model": "smol",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
    }
    error = refused(CHAT, body)
    assert error.code == "unsupported_url"
    assert error.param == "messages[0].content[1].image_url"


def test_media_by_http_or_data_url_passes() -> None:
    for url in ("https://example.com/cat.png", "data:image/png;base64,AAAA"):
        content = [{"type": "image_url", "image_url": {"url": url}}]
        body = {"model": "smol", "messages": [{"role": "user", "content": content}]}
        assert parse_proxied_request(CHAT, body).model == "smol"


def test_model_names_an_adapter_after_a_colon() -> None:
    parsed = parse_proxied_request(CHAT, {**CHAT_BODY, "model": "smol:sql-lora"})
    assert (parsed.model, parsed.adapter) == ("smol", "sql-lora")
    assert parse_proxied_request(CHAT, CHAT_BODY).adapter is None
    assert refused(CHAT, {**CHAT_BODY, "model": "smol:"}).param == "model"
    assert refused(CHAT, {**CHAT_BODY, "model": ""}).param == "model"
    assert refused(CHAT, {**CHAT_BODY, "model": 7}).param == "model"


def test_chat_needs_messages_and_completions_a_prompt() -> None:
    assert refused(CHAT, {"model": "smol"}).param == "messages"
    assert refused(CHAT, {"model": "smol", "messages": []}).param == "messages"
    assert refused(COMPLETIONS, {"model": "smol"}).param == "prompt"


def test_embeddings_take_strings_or_token_ids_and_never_stream() -> None:
    for value in ("hello", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        parsed = parse_proxied_request(EMBEDDINGS, {"model": "e5", "input": value})
        assert parsed.stream is False
    for bad in (None, [], 5, [True], {"a": 1}):
        assert refused(EMBEDDINGS, {"model": "e5", "input": bad}).param == "input"


def test_stream_and_usage_options() -> None:
    parsed = parse_proxied_request(
        CHAT, {**CHAT_BODY, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert parsed.stream
    assert parsed.wants_usage
    assert refused(CHAT, {**CHAT_BODY, "stream": "yes"}).param == "stream"
    assert refused(CHAT, {**CHAT_BODY, "stream_options": 1}).param == "stream_options"


def test_user_is_kept_for_session_affinity() -> None:
    assert parse_proxied_request(CHAT, {**CHAT_BODY, "user": "u-42"}).user == "u-42"
    assert refused(CHAT, {**CHAT_BODY, "user": ["x"]}).param == "user"


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b'"x"', b"[" * 100_000 + b"]" * 100_000])
def test_bodies_that_are_not_a_json_object_are_400(raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        parse_json_object(raw)
    assert caught.value.status == 400
    assert caught.value.code == "invalid_json"


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (b'{"model":"a","model":"b","prompt":"x"}', "model"),
        (b'{"model":"a","messages":[{"role":"user","role":"system","content":"x"}]}', "role"),
        (b'{"model":"a","x":{"y":[{"z":1,"z":2}]}}', "z"),
        ('{"model":"a","\u00e9":1,"\u00e9":2}'.encode(), "\u00e9"),
    ],
)
def test_a_name_twice_in_one_object_at_any_depth_is_refused_naming_it(
    raw: bytes, name: str
) -> None:
    # json.loads keeps the last, an engine's parser may keep the first: the gateway would route
    # and check one request and the engine serve another.
    with pytest.raises(ApiError) as caught:
        parse_json_object(raw)
    assert caught.value.status == 400
    assert caught.value.code == "duplicate_key"
    assert caught.value.param == json.loads(f'"{name}"')


def test_the_same_name_in_different_objects_passes() -> None:
    raw = b'{"model":"a","messages":[{"role":"user","content":"x"},{"role":"user","content":"y"}]}'
    assert parse_json_object(raw)["messages"][1]["content"] == "y"


def test_a_text_part_without_a_string_is_refused_naming_the_field() -> None:
    body = {"model": "smol", "messages": [{"role": "user", "content": [{"text": None}]}]}
    with pytest.raises(ApiError) as refused:
        parse_proxied_request("/v1/chat/completions", body)
    assert refused.value.status == 400
    assert refused.value.param == "messages[0].content[0].text"


@pytest.mark.parametrize("salt", [7, True, ["a"], {"k": "v"}, "", "s" * 1025])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, EMBEDDINGS])
def test_a_cache_salt_that_is_not_a_short_string_is_refused_naming_it(
    path: str, salt: object
) -> None:
    # vLLM takes 1 to 1,024 characters; the gateway may put a key's salt in front of it.
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    error = refused(path, {**body, "input": "hi", "cache_salt": salt})
    assert error.param == "cache_salt"
    assert "'cache_salt' must be a string of 1 to 1,024 characters" in error.message


@pytest.mark.parametrize("salt", [None, "tenant-a", "s" * 1024])
def test_a_cache_salt_string_or_null_passes_untouched(salt: str | None) -> None:
    request = parse_proxied_request(CHAT, {**CHAT_BODY, "cache_salt": salt})
    assert request.body["cache_salt"] == salt
