"""What an engine's exit may say outside its node: one short line, redacted.

An engine's log can hold prompts and completions (a request logged on error, a tokenizer
warning quoting its input), and an exit reason travels in workflow histories that anyone with
the Temporal UI can read. So the log stays on the node (0600, its path in the shard's spec) and
only one line that mentions an error leaves it: cut where a prompt or quoted text begins,
and capped. That line is the first exception the log names, when it names one: a Python engine
that fails in a subprocess logs the cause first and then the exceptions it caused (vLLM's API
server ends with "Engine core initialization failed. See root cause above."). Otherwise it is
the last line that mentions an error.
"""

from __future__ import annotations

import re

MAX_REASON_CHARS = 200
_ELIDED = " [...]"
_ERROR = re.compile(r"error|exception|fatal|traceback", re.IGNORECASE)
# A raised exception as Python prints it: "ValueError: ...", perhaps after a log prefix.
_EXCEPTION = re.compile(r"(?:^|\s)[A-Z]\w*(?:Error|Exception): \S")
# Where the user's text may begin: anything from here on is dropped.
_CUT = re.compile(r"prompt|input|request|messages|content|['\"`]", re.IGNORECASE)
# Carriage returns and other control characters (progress bars, colour codes).
_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x1f\x7f]")


def error_line(log_tail: str, limit: int = MAX_REASON_CHARS) -> str:
    """The first exception `log_tail` names, else its last line that mentions an error,
    redacted; "" when none does."""
    lines = [_CONTROL.sub(" ", raw).strip() for raw in log_tail.splitlines()]
    exceptions = [line for line in lines if _EXCEPTION.search(line)]
    if exceptions:
        return _redacted(exceptions[0], limit)
    for line in reversed(lines):
        if line and _ERROR.search(line):
            return _redacted(line, limit)
    return ""


def _redacted(line: str, limit: int) -> str:
    cut = _CUT.search(line)
    if cut is not None:
        line = line[: cut.start()].rstrip(" :=(,[{") + _ELIDED
    if len(line) > limit:
        line = line[: limit - len(_ELIDED)].rstrip() + _ELIDED
    return line
