"""A request's priority class: asked in the `x-llmgw-priority` header or the body's `priority`
field, as a class name or its index (0, the highest, to 3; lower means sooner, as in vLLM's own
`priority` field). A request that asks none gets DEFAULT_PRIORITY, or its key's top class if
that is lower. Asking above the key's top class is refused, not quietly lowered: a client that
believes it is interactive should learn that it is not."""

from __future__ import annotations

from typing import Any

from gateway.errors import ApiError
from store.models import DEFAULT_PRIORITY, PRIORITY_CLASSES, PriorityClass

PRIORITY_HEADER = b"x-llmgw-priority"
PRIORITY_FIELD = "priority"

# Each class's index, looked up for every request rather than searched for in the tuple.
_INDEX: dict[str, int] = {name: i for i, name in enumerate(PRIORITY_CLASSES)}
_DEFAULT_INDEX = _INDEX[DEFAULT_PRIORITY]


def class_index(name: PriorityClass) -> int:
    return PRIORITY_CLASSES.index(name)


def request_priority(header: bytes | None, body: dict[str, Any], top: PriorityClass) -> int:
    """The class index the request is queued in. Takes the `priority` field out of the body:
    engines read it their own way (vLLM refuses a request with one unless started for it), so
    the gateway sets it per route."""
    asked: object = body.pop(PRIORITY_FIELD, None)
    where = PRIORITY_FIELD
    if header is not None:
        asked, where = header.decode("latin-1").strip(), PRIORITY_HEADER.decode()
    top_index = _INDEX.get(top)
    if top_index is None:
        top_index = class_index(top)  # not a class: raises as it always did
    if asked is None:
        return max(_DEFAULT_INDEX, top_index)
    index = _parse(asked, where)
    if index < top_index:
        raise ApiError(
            400,
            f"This key may ask for priority '{top}' at most, not '{PRIORITY_CLASSES[index]}'.",
            param=where,
            code="priority_not_allowed",
        )
    return index


def _parse(asked: object, where: str) -> int:
    if isinstance(asked, str) and asked in PRIORITY_CLASSES:
        return PRIORITY_CLASSES.index(asked)
    last = len(PRIORITY_CLASSES) - 1
    number = asked.strip() if isinstance(asked, str) else asked
    if isinstance(number, str) and number.lstrip("-").isdigit():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int):
        raise ApiError(
            400,
            f"'{where}' must be one of {', '.join(PRIORITY_CLASSES)}, or 0 to {last}.",
            param=where,
            code="invalid_priority",
        )
    if not 0 <= number <= last:
        raise ApiError(
            400,
            f"'{where}' {number} is out of range: 0 (the highest, '{PRIORITY_CLASSES[0]}') to "
            f"{last} ('{PRIORITY_CLASSES[-1]}').",
            param=where,
            code="invalid_priority",
        )
    return number
