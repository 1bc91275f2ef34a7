"""Usage as CSV, for a spreadsheet or a billing script.

Key and model names are chosen by people and may start with `=`, `+`, `-` or `@`, which a
spreadsheet would run as a formula (CSV injection); such cells get a leading `'`, the usual
"treat as text" mark. Counts never start that way, so numbers stay numbers.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

from store import UsageRow

HEADER = (
    "day",
    "key_id",
    "key_name",
    "model",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(text: str) -> str:
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def usage_csv(rows: Iterable[UsageRow], key_names: dict[str, str]) -> str:
    """One line per (day, key, model); `key_names` maps key_id to name (empty when unknown,
    e.g. a key deleted from another store)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(HEADER)
    for row in rows:
        writer.writerow(
            [
                row.day.isoformat(),
                safe_cell(row.key_id),
                safe_cell(key_names.get(row.key_id, "")),
                safe_cell(row.model),
                row.requests,
                row.prompt_tokens,
                row.completion_tokens,
                row.total_tokens,
            ]
        )
    return out.getvalue()
