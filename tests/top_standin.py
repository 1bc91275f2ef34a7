"""`llmgw top`'s console on a stand-in source: a TopData JSON file read again at every refresh.
tests/unit/test_top_tmux.py runs it in tmux as `python -m tests.top_standin FILE SECONDS`."""

import asyncio
import sys

from workers.top.console import run_console
from workers.top.source import FileSource

if __name__ == "__main__":
    asyncio.run(run_console(FileSource(sys.argv[1]), float(sys.argv[2])))
