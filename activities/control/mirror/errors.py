"""The one error the mirror raises: its message is what the operator reads."""

from __future__ import annotations


class MirrorError(Exception):
    """A source refused, a download that failed or a file that did not verify, in words."""
