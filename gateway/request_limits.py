"""How much one request may ask of an engine: prompts, generated sequences and prompt tokens,
checked on the parsed body before anything is sent, each refusal a 400 naming the limit and the
field. Pure: no I/O, no clock.

Without these, one small body is a denial of service: 20,000 one-token prompts (100 KB) kept a
CPU llama-server busy for 3.5 minutes, and 4.2 million `[0]` prompts (16 MB) grew it to 23 GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import bad_request
from gateway.request_body import COMPLETIONS, EMBEDDINGS
from gateway.settings import GatewaySettings
from store.models import KeyLimits


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The limits in force for one key: its own where set, else the gateway's."""

    max_prompts_per_request: int
    max_choices_per_request: int
    max_prompt_tokens_per_request: int
    max_inflight_prompt_tokens: int

    @classmethod
    def effective(cls, settings: GatewaySettings, key: KeyLimits) -> RequestLimits:
        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        return cls(
            pick(key.max_prompts_per_request, settings.max_prompts_per_request),
            pick(key.max_choices_per_request, settings.max_choices_per_request),
            pick(key.max_prompt_tokens_per_request, settings.max_prompt_tokens_per_request),
            pick(key.max_inflight_prompt_tokens, settings.max_inflight_prompt_tokens),
        )


def prompt_count(value: object) -> int:
    """How many prompts a completions `prompt` or embeddings `input` holds: a string or one
    array of token ids is one; an array of strings or of token-id arrays is one per item."""
    if not isinstance(value, list):
        return 1
    if all(isinstance(item, int) for item in value):
        return 1
    return len(value)


def check_request(
    path: str, body: dict[str, Any], prompt_tokens: int, limits: RequestLimits
) -> None:
    """Raise a 400 ApiError when the request passes one of `limits`. `prompt_tokens` is the
    prompt's upper-bound estimate (gateway/prompt_estimate.py)."""
    field = "input" if path == EMBEDDINGS else "prompt"
    prompts = prompt_count(body.get(field)) if path in (COMPLETIONS, EMBEDDINGS) else 1
    if prompts > limits.max_prompts_per_request:
        raise _over(
            "max_prompts_per_request",
            limits.max_prompts_per_request,
            f"'{field}' holds {prompts} prompts",
            field,
        )
    # n_cmpl: llama.cpp's own name for n, which it reads first.
    for name in ("n", "best_of", "n_cmpl"):
        value = body.get(name)
        if isinstance(value, int) and value > limits.max_choices_per_request:
            raise _over(
                "max_choices_per_request",
                limits.max_choices_per_request,
                f"'{name}' is {value}",
                name,
            )
    if path == COMPLETIONS:
        # Each prompt is generated n times (best_of times, when larger, to return the best n).
        per_prompt = max(_count(body.get(name)) for name in ("n", "best_of", "n_cmpl"))
        choices = prompts * per_prompt
        if choices > limits.max_choices_per_request:
            raise _over(
                "max_choices_per_request",
                limits.max_choices_per_request,
                f"{prompts} prompts x {per_prompt} choices each make {choices} completions",
                "prompt",
            )
    where = field if path in (COMPLETIONS, EMBEDDINGS) else "messages"
    if prompt_tokens > limits.max_prompt_tokens_per_request:
        raise _over(
            "max_prompt_tokens_per_request",
            limits.max_prompt_tokens_per_request,
            f"the prompt is estimated at up to {prompt_tokens} tokens (about one per byte)",
            where,
        )
    if prompt_tokens > limits.max_inflight_prompt_tokens:
        # Refused here, for good: gateway/key_inflight.py would answer 429 to it forever.
        raise _over(
            "max_inflight_prompt_tokens",
            limits.max_inflight_prompt_tokens,
            f"the prompt is estimated at up to {prompt_tokens} tokens (about one per byte)",
            where,
        )


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 1 else 1


def _over(limit: str, allowed: int, what: str, param: str) -> Exception:
    return bad_request(
        f"{what}, over this key's limit {limit} = {allowed}; split it into smaller requests.",
        param=param,
        code=f"{limit}_exceeded",
    )
