"""Reading the project's own Python source as a syntax tree, for tests that check the code itself
(which LLMGW_* names it reads, which patch ids it uses, what the ledger imports)."""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse_file(path: Path) -> ast.Module:
    """`path` parsed, with the garbage collector off meanwhile. On CPython 3.11 a finalizer
    that formats a traceback (an earlier test's abandoned asyncio task, logged as it is
    collected) calls ast.parse from inside this parse, and the outer parse then fails with
    "SystemError: AST constructor recursion depth mismatch" (seen once in CI)."""
    source = path.read_text()
    gc.disable()
    try:
        return ast.parse(source, str(path))
    finally:
        gc.enable()
