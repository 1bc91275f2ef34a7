"""The body fields the gateway judges by name: those it refuses outright (they would send a
request elsewhere, pick an adapter past a key's allowlist, carry code, or a prompt it cannot
count), where media may come from, and the numeric ranges of OpenAI's and the engines' own
length, count and size fields. Tables only; gateway/request_body.py applies them."""

from __future__ import annotations

# Fields some OpenAI proxies honour to send a request elsewhere or with other credentials
# (LiteLLM's api_base SSRF, CVE-2024-6587). Engines would ignore most of them, but a request
# carrying one is either confused or probing: refuse it outright.
REDIRECTING_FIELDS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "headers",
        "extra_headers",
        "api_version",
        "organization",
        "custom_llm_provider",
        # The engines' own: where a disaggregated prefill sends its KV cache, or fetches it
        # from (SGLang's bootstrap_*, vLLM's kv_transfer_params, TensorRT-LLM's
        # disaggregated_params). From a client, they would point an engine at any host.
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "kv_transfer_params",
        "disaggregated_params",
    }
)
# llama-server applies a loaded LoRA adapter to any request whose `lora` field lists its id;
# SGLang loads the adapter a `lora_path` names and TensorRT-LLM the one a `lora_request`
# describes: passed on, they would apply adapters the key's allowlist does not grant. The
# adapter is chosen by name through `model` instead, where the allowlist is checked.
ADAPTER_SELECTING_FIELDS = frozenset({"lora", "lora_path", "lora_request"})
# SGLang runs a `custom_logit_processor` a request carries (serialised Python) when started
# with --enable-custom-logit-processor: code from a client, never passed on.
CODE_FIELDS = frozenset({"custom_logit_processor"})

# Media given by URL: an engine started with a local-media path would read `file:` URLs from
# its own disk, so only data: and http(s): are passed on; an http(s) URL is then checked and
# pinned to a public address (gateway/media_urls.py).
MEDIA_PARTS = ("image_url", "audio_url", "video_url", "input_audio", "file")
# Where a media part given as an object holds its URL: OpenAI's and the engines' `url`, and the
# `file_url` some clients give a file's URL in (a file's `file_data` is base64, not a URL).
MEDIA_URL_NAMES = ("url", "file_url")
ALLOWED_MEDIA_SCHEMES = ("http://", "https://", "data:")

# (field, lowest, highest, integer?) — checked before anything reaches an engine, so a typo
# costs a 400 and not an engine's stack trace or a 10-million-token reservation.
NUMERIC_RANGES: tuple[tuple[str, float, float, bool], ...] = (
    ("max_tokens", 1, 1_000_000, True),
    ("max_completion_tokens", 1, 1_000_000, True),
    ("n", 1, 128, True),
    ("best_of", 1, 128, True),
    ("top_logprobs", 0, 20, True),
    ("temperature", 0, 2, False),
    ("top_p", 0, 1, False),
    ("presence_penalty", -2, 2, False),
    ("frequency_penalty", -2, 2, False),
    ("seed", -(2**63), 2**63 - 1, True),
)
# Fields an engine reads, under its own name, as a length, a count or a size (read in llama.cpp's
# tools/server params_from_json_cmpl, vLLM's, SGLang's and TensorRT-LLM's OpenAI protocol.py).
# Unchecked, each was a way past the checks above: llama.cpp reads n_predict before max_tokens,
# so `max_tokens: 1, n_predict: -1` generated until the context was full, and `n_probs: 1000000`
# passed the 0-20 logprobs check. Each is held to the range of the OpenAI field it stands in for
# or, for a window over the context, to the context's own bound; -1 is let through only where
# the engine reads it as "the whole prompt or context", which is bounded. docs/gateway.md lists
# which engine reads which field.
MAX_LENGTH = 1_000_000  # max_tokens' own bound
MAX_CONTEXT = 1_048_576  # max_prompt_tokens_per_request's default: longer than any context
ENGINE_RANGES: tuple[tuple[str, float, float, bool], ...] = (
    # Completion lengths: clamped with max_tokens (gateway/billing.py, LENGTH_FIELDS).
    ("n_predict", 1, MAX_LENGTH, True),  # llama.cpp; -1 (no limit) and 0 are refused
    ("min_tokens", 0, MAX_LENGTH, True),  # vLLM, SGLang, TensorRT-LLM
    ("thinking_token_budget", -1, MAX_LENGTH, True),  # TensorRT-LLM, within max_tokens
    # Choices: as n, and counted against max_choices_per_request (gateway/request_limits.py).
    ("n_cmpl", 1, 128, True),  # llama.cpp's n
    # Log probabilities per token: as logprobs and top_logprobs.
    ("n_probs", 0, 20, True),  # llama.cpp
    ("prompt_logprobs", 0, 20, True),  # vLLM, TensorRT-LLM; -1 (the whole vocabulary) refused
    # Windows over the prompt or the context, in tokens.
    ("n_keep", -1, MAX_CONTEXT, True),  # llama.cpp, on a context shift; -1: the whole prompt
    ("n_discard", 0, MAX_CONTEXT, True),  # llama.cpp, on a context shift
    ("repeat_last_n", -1, MAX_CONTEXT, True),  # llama.cpp; -1: the context
    ("dry_penalty_last_n", -1, MAX_CONTEXT, True),  # llama.cpp; -1: the context
    ("dry_allowed_length", 0, MAX_CONTEXT, True),  # llama.cpp
    ("truncate_prompt_tokens", -1, MAX_CONTEXT, True),  # vLLM, TensorRT-LLM; -1: the model's
    ("prompt_ignore_length", 0, MAX_CONTEXT, True),  # TensorRT-LLM
    ("routed_experts_start_len", 0, MAX_CONTEXT, True),  # SGLang
    ("n_indent", 0, MAX_CONTEXT, True),  # llama.cpp, characters of indentation
    # Tokens a sampler keeps: at most the vocabulary, whatever is asked.
    ("top_k", -1, MAX_LENGTH, True),  # all four; -1 or 0: no top-k
    ("min_keep", 0, MAX_LENGTH, True),  # llama.cpp
    # Draft tokens per step, llama.cpp (its own default is 16).
    ("speculative.n_max", 0, 256, True),
    ("speculative.n_min", 0, 256, True),
    # Image tiles, SGLang (InternVL): 12 tiles of 256 tokens is what the prompt estimate's
    # 4,096 tokens per image (gateway/prompt_estimate.py) covers.
    ("max_dynamic_patch", 1, 12, True),
    ("min_dynamic_patch", 1, 12, True),
    # A time limit on generating, llama.cpp: it only ends a completion sooner.
    ("t_max_predict_ms", 0, 86_400_000, True),
)
# Engine fields that give the prompt in a form the gateway does not count (its estimate, the
# request limits and the quota reservation would not see it): refused, naming the field.
UNCOUNTED_PROMPT_FIELDS = {
    "input_ids": "SGLang's prompt as token ids, in place of the messages",
    "prompt_embeds": "vLLM's prompt as embedding tensors",
}
