"""The estimated prompt tokens each key has in flight in this gateway, bounded per key: one
client cannot fill every engine's queue with huge prompts, whatever its request rate.

Acquired once a request is admitted and released when it ends, however it ends (`held`).
Counts are per gateway, in memory; nothing here awaits, so a check and its acquire are atomic
on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.errors import ApiError

# Requests end within seconds to minutes; a client retrying sooner would only be refused again.
RETRY_AFTER_S = "2"


class KeyInFlight:
    def __init__(self) -> None:
        self._tokens: dict[str, int] = {}

    @property
    def tokens(self) -> Mapping[str, int]:
        return self._tokens

    def acquire(self, key_id: str, tokens: int, limit: int) -> None:
        """Count `tokens` against `key_id`, or raise 429 when that would pass `limit`."""
        held = self._tokens.get(key_id, 0)
        if held + tokens > limit:
            raise ApiError(
                429,
                f"This key has requests estimated at {held} prompt tokens in flight; this one "
                f"({tokens}) would pass its limit max_inflight_prompt_tokens = {limit}. "
                "Retry when some have finished.",
                type_="rate_limit_error",
                code="max_inflight_prompt_tokens_exceeded",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        self._tokens[key_id] = held + tokens

    def release(self, key_id: str, tokens: int) -> None:
        left = self._tokens.get(key_id, 0) - tokens
        if left > 0:
            self._tokens[key_id] = left
        else:
            # Dropped at zero, so the table holds only keys with requests in flight.
            self._tokens.pop(key_id, None)

    def held(self, key_id: str, tokens: int, limit: int) -> Held:
        """Acquire for the block (raising 429 before it runs when over `limit`), release
        after it, on every exit: an answer, an error, a cancelled task."""
        return Held(self, key_id, tokens, limit)


class Held:
    """KeyInFlight.held's context manager. A class rather than @contextmanager: every request
    enters one, and a generator-based one costs about a microsecond more to make and run."""

    __slots__ = ("_book", "_key_id", "_limit", "_tokens")

    def __init__(self, book: KeyInFlight, key_id: str, tokens: int, limit: int) -> None:
        self._book = book
        self._key_id = key_id
        self._tokens = tokens
        self._limit = limit

    def __enter__(self) -> None:
        self._book.acquire(self._key_id, self._tokens, self._limit)

    def __exit__(self, *exc_info: object) -> None:
        self._book.release(self._key_id, self._tokens)
