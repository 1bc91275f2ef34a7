"""Usage as CSV: what a spreadsheet shows when the file is opened."""

from __future__ import annotations

import csv
import io
from datetime import date

import pytest

from gateway.usage_export import HEADER, usage_csv
from store import UsageRow


def _row(key_id: str = "0a1b2c3d", model: str = "llama", **counts: int) -> UsageRow:
    return UsageRow(
        key_id=key_id,
        model=model,
        day=date(2025, 4, 1),
        requests=counts.get("requests", 2),
        prompt_tokens=counts.get("prompt_tokens", 30),
        completion_tokens=counts.get("completion_tokens", 12),
    )


def _parse(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_one_line_per_row_under_the_documented_header() -> None:
    rows = [_row(), _row(key_id="deadbeef", model="qwen", prompt_tokens=5, completion_tokens=0)]
    parsed = _parse(usage_csv(rows, {"0a1b2c3d": "ci"}))
    assert (
        parsed[0]
        == list(HEADER)
        == [
            "day",
            "key_id",
            "key_name",
            "model",
            "requests",
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
        ]
    )
    assert parsed[1] == ["2025-04-01", "0a1b2c3d", "ci", "llama", "2", "30", "12", "42"]
    # A key the names map does not know (deleted elsewhere) gets an empty name, not an error.
    assert parsed[2] == ["2025-04-01", "deadbeef", "", "qwen", "2", "5", "0", "5"]


def test_no_rows_is_just_the_header() -> None:
    assert _parse(usage_csv([], {})) == [list(HEADER)]


@pytest.mark.parametrize(
    "hostile",
    ['=HYPERLINK("http://evil")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\r=1"],
)
def test_cells_a_spreadsheet_would_evaluate_are_neutralised(hostile: str) -> None:
    parsed = _parse(usage_csv([_row(model=hostile)], {"0a1b2c3d": hostile}))
    _, _, key_name, model, *_ = parsed[1]
    assert key_name == "'" + hostile
    assert model == "'" + hostile


@pytest.mark.parametrize(
    "awkward", ['say "hi", then leave', "line\nbreak", "comma,inside", "emoji \U0001f999"]
)
def test_quotes_commas_and_newlines_survive_a_csv_reader(awkward: str) -> None:
    parsed = _parse(usage_csv([_row(model=awkward)], {}))
    assert parsed[1][3] == awkward
    assert len(parsed) == 2, "an embedded newline stays inside its quoted cell"


def test_numbers_stay_numbers() -> None:
    parsed = _parse(usage_csv([_row(requests=1, prompt_tokens=0, completion_tokens=9)], {}))
    assert parsed[1][4:] == ["1", "0", "9", "9"]
