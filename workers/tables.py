"""Plain-text tables for the operator's commands."""


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines)
