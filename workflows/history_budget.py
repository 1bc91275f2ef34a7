"""When a long-lived workflow continues as new.

Temporal terminates a run whose history reaches 51,200 events or 50 MB, and a terminated entity
workflow never gets to clean up (a replica's allocation and route would leak). Every long-lived
workflow therefore asks `time_to_continue()` at each point where its whole state is carried in
one model, and continues as new when it answers yes: when the server suggests it, or well before
the hard limits in any case.

LLMGW_TEST_CONTINUE_AS_NEW_EVERY=N (tests only) continues as new once a run has N events, so
the workflow suite exercises every carry path at every step. It is read once, when a worker
imports this module, so a worker's replays agree with its own runs.
"""

import os

from temporalio import workflow

# Far below the hard limit (51,200), and below the server's first warning (10,240), so a run
# continues as new long before anything is at risk even if the server never suggests it.
MAX_EVENTS = 8_000
FORCE_EVERY_EVENTS = int(os.environ.get("LLMGW_TEST_CONTINUE_AS_NEW_EVERY", "0") or 0)


def time_to_continue(forced: bool = True) -> bool:
    """Whether this run should continue as new at its next safe point. `forced=False` ignores
    the test knob: the ledger, which every test shares, continues as new only at the real
    limits (a ledger continuing as new every few events under the time-skipping test server's
    update handling made unrelated tests flaky)."""
    info = workflow.info()
    if info.is_continue_as_new_suggested():
        return True
    limit = (FORCE_EVERY_EVENTS if forced else 0) or MAX_EVENTS
    return info.get_current_history_length() >= limit
