"""What an engine's exit may say outside its node: one short line, redacted.

An engine's log can hold prompts and completions (a request logged on error, a tokenizer
warning quoting its input), and an exit reason travels in workflow histories that anyone with
the Temporal UI can read. So the log stays on the node (0600, its path in the shard's spec) and
only the last line that mentions an error leaves it: cut where a prompt or quoted text begins,
and capped.
"""

from __future__ import annotations

import re

MAX_REASON_CHARS = 200
_ELIDED = " [...]"
_ERROR = re.compile(r"error|exception|fatal|traceback", re.IGNORECASE)
# Where the user's text may begin: anything from here on is dropped.
_CUT = re.compile(r"prompt|input|request|messages|content|['\"`]", re.IGNORECASE)
# Carriage returns and other control characters (progress bars, colour codes).
_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x1f\x7f]")


def error_line(log_tail: str, limit: int = MAX_REASON_CHARS) -> str:
    """The last line of `log_tail` that mentions an error, redacted; "" when none does."""
    for raw in reversed(log_tail.splitlines()):
        line = _CONTROL.sub(" ", raw).strip()
        if not line or not _ERROR.search(line):
            continue
        cut = _CUT.search(line)
        if cut is not None:
            line = line[: cut.start()].rstrip(" :=(,[{") + _ELIDED
        if len(line) > limit:
            line = line[: limit - len(_ELIDED)].rstrip() + _ELIDED
        return line
    return ""
