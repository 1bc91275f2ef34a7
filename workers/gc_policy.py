"""Python's garbage collector in the control worker, which holds every ledger cell's state.

A full collection walks every object in the process, and Python starts one each time the
objects that survived younger collections reach a quarter of the old ones: in a worker holding
ten 1,000-node cells (1.6 million objects), about every third ledger run's unpacking of its
state set one off, and took that unpacking from 0.4 s to 2.2 s, past the 2 s the Temporal SDK
allows an activation (its deadlock detector; after such a failure a run can stay stuck in the
worker until workers/stuck_runs.py restarts it: docs/benchmarks.md). Larger thresholds make
the young collections rarer and a full one far rarer (in the same measurement the slowest
unpacking was 1.1 s, most 0.3 s).
Garbage in reference cycles that outlives the young collections waits longer to be freed:
the ledger's models hold no cycles.
"""

import gc

# Allocations before a young collection (700 by default), young collections before a middle
# one (10), middle ones before a full one is considered (10).
THRESHOLDS = (50_000, 20, 100)


def for_large_state() -> None:
    """Collect rarely: for a process holding the ledger's state (the control worker)."""
    gc.set_threshold(*THRESHOLDS)
