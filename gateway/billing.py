"""What a request is billed: every choice it generates counted, whatever the engine reports.

A request with `n` (or best_of) above 1, or an array of prompts, generates several completions,
and engines do not all report them: llama.cpp's server runs each choice as a task of its own
and, merging a whole (non-streamed) response, keeps the `usage` of the first task only
(tools/server/server-context.cpp, handle_completions_impl). See `whole_response_counts` and
`stream_counts` for the rules. Pure: the relay (gateway/relay.py) and the reservation
(gateway/proxy.py) call it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.quota import Reservation
from gateway.request_body import COMPLETIONS
from gateway.sse import UsageFilter
from workflows.contracts import engine_facts

# Usage read out of a whole response without parsing it all: engines put it at the end.
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def usage_from_body(raw: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a whole JSON response, None when it reports none."""
    at = raw.rfind(b'"usage"')
    if at < 0:
        return None
    tail = raw[at:]
    prompt = _PROMPT_TOKENS.search(tail)
    completion = _COMPLETION_TOKENS.search(tail)
    if prompt is None:
        return None
    return int(prompt.group(1)), int(completion.group(1)) if completion else 0


def usage_counts(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int):
        return None
    return prompt, completion if isinstance(completion, int) else 0


def counts_every_choice(engine: str) -> bool:
    """Whether the engine's `usage` covers every choice of a response: its row says
    (workflows/contracts/engine_facts.py, counts_every_choice: vLLM and SGLang). Any other
    engine is assumed to report a single choice, as llama.cpp does."""
    facts = engine_facts(engine)
    return facts is not None and facts.counts_every_choice


def choices_requested(path: str, body: dict[str, Any]) -> tuple[int, int]:
    """(completions the engine generates, prompts) for a chat or completions body.

    Per prompt: n or best_of, whichever generates more (vLLM generates best_of and returns n),
    or llama.cpp's own n_cmpl, which it reads before n. /v1/completions takes an array of
    prompts (strings, or arrays of token ids), each completed that many times; a flat array of
    token ids is one prompt."""
    per_prompt = 1
    for field in ("n", "best_of", "n_cmpl"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            per_prompt = max(per_prompt, value)
    prompts = 1
    prompt = body.get("prompt")
    if path == COMPLETIONS and isinstance(prompt, list) and prompt:
        # Strings, or arrays of token ids: one prompt each (a flat array of ids is one prompt).
        prompts = len(prompt) if all(isinstance(i, str | list) for i in prompt) else 1
    return per_prompt * prompts, prompts


# The fields that bound a completion's length, per choice, as OpenAI, vLLM and llama.cpp read
# them. llama.cpp reads its own n_predict before the other two, and -1 there means no limit.
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")


def completion_length(body: dict[str, Any]) -> tuple[list[str], int | None]:
    """(the length fields to set when clamping, the longest completion the body asks for, None
    for no limit). Every field present counts, since engines disagree on which one wins."""
    # One pass over the three names, no list but the answer: it runs twice per request
    # (reservation and queue cost), and four list comprehensions took 0.9 us a call.
    fields: list[str] = []
    longest: int | None = None
    unbounded = False
    for name in LENGTH_FIELDS:
        if name not in body:
            continue
        fields.append(name)
        value = body[name]
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            if longest is None or value > longest:
                longest = value
        else:
            unbounded = True
    if not fields:
        return ["max_tokens"], None
    if unbounded:
        # A length that is not a positive count (n_predict: -1) asks for no limit.
        return [f for f in fields if body[f] is not None], None
    return fields, longest


def whole_response_counts(
    raw: bytes,
    engine: str,
    reservation: Reservation,
    prompt_estimate: int,
) -> tuple[int, int]:
    """(prompt, completion) tokens to bill for a whole (non-streamed) answer.

    One choice: the engine's usage, as it reports it. Several: the response is parsed and its
    choices counted. An engine that counts every choice (`counts_every_choice`) is
    believed. Any other is taken to report one choice, as llama.cpp does when it merges the
    choices of its tasks into one response and keeps the first task's usage: each further
    choice is billed at the most it could have been, its max_tokens (the reservation's
    per-choice bound), since nothing in the response tells its length. Over-counting is the
    safe side: a budget is never overrun. With several prompts the first prompt's count is all
    llama.cpp reports, so the gateway's own upper bound for all of them is billed instead.
    An older llama.cpp answered an array of prompts with an array of responses, each with its
    own usage: those are added up."""
    if reservation.choices <= 1:
        return usage_from_body(raw) or (0, 0)
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        return usage_from_body(raw) or (0, 0)
    parts = answer if isinstance(answer, list) else [answer]
    prompt = completion = choices = 0
    for part in parts:
        if not isinstance(part, dict):
            continue
        counts = usage_counts(part.get("usage"))
        if counts is not None:
            prompt += counts[0]
            completion += counts[1]
        listed = part.get("choices")
        if isinstance(listed, list):
            # Each usage covers at least one choice: only the choices beyond one per usage
            # are unaccounted for.
            choices += max(len(listed) - (1 if counts is not None else 0), 0)
    if counts_every_choice(engine):
        return prompt, completion
    per_choice = reservation.per_choice_tokens or 0
    completion += choices * per_choice
    if reservation.prompts > 1 and len(parts) == 1:
        prompt = max(prompt, prompt_estimate)
    return prompt, completion


def with_usage(raw: bytes, counts: tuple[int, int]) -> bytes:
    """A whole answer whose `usage` says `counts` (prompt, completion), what was billed: the
    body as it came when it already does, or is not one JSON object with a usage."""
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    if not isinstance(answer, dict) or not isinstance(answer.get("usage"), dict):
        return raw
    prompt, completion = counts
    usage = answer["usage"]
    if (usage.get("prompt_tokens"), usage.get("completion_tokens")) == counts:
        return raw
    usage.update(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
    return json.dumps(answer).encode()


def stream_counts(counted: UsageFilter, reservation: Reservation) -> tuple[int, int] | None:
    """(prompt, completion) tokens to bill for a stream, None when the engine reported none.

    One choice: the engine's usage. Several: the usage chunks that end a choice are added up
    (llama.cpp sends one per choice, vLLM and SGLang one in all), and the completion is never
    billed below what the gateway itself saw go by: the chunks that carried text, about a token
    each, per choice. The prompt: with one prompt every usage chunk counts the same prompt
    (llama.cpp's choices each report it), so the largest is billed; with several, the sum."""
    if not counted.count_choices:
        return usage_counts(counted.usage)
    own = sum(counted.per_choice.values())
    if counted.final_usages:
        prompt = counted.usage_prompt_sum if reservation.prompts > 1 else counted.usage_prompt_max
        counts: tuple[int, int] | None = (prompt, counted.usage_completion_sum)
    else:
        counts = usage_counts(counted.usage)
    if counts is None:
        return None
    return counts[0], max(counts[1], own)
