"""A Temporal dev server of a benchmark's own, in a scratch directory."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engines.local_port import free_port
from workers.temporal_server import TemporalDevServer


@contextmanager
def scratch_dev_server(keep: bool = False) -> Iterator[tuple[TemporalDevServer, Path]]:
    """A started dev server (no UI) and its directory, removed afterwards unless `keep`."""
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    server = TemporalDevServer(
        db_file=workdir / "temporal.db",
        log_file=workdir / "temporal.log",
        port=free_port(),
        ui_port=None,
    )
    try:
        server.start()
        yield server, workdir
    finally:
        server.stop()
        if keep:
            print(f"kept {workdir} (temporal.db, temporal.log)", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
