"""Activity timeouts and retry policies, named, with the reasoning beside them."""

import os
from datetime import timedelta

from temporalio.common import RetryPolicy

# Ledger calls are quick updates on one workflow; retry briskly, they are idempotent.
LEDGER_CALL_TIMEOUT = timedelta(seconds=30)
LEDGER_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5)
)

# A source build of llama.cpp takes about 14 minutes on two busy cores; the heartbeat carries
# its progress, and a silent agent is noticed within two minutes.
INSTALL_TIMEOUT = timedelta(hours=1)
INSTALL_HEARTBEAT = timedelta(minutes=2)
INSTALL_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=5))
# All attempts together, waits in the node's queue included: an install on a machine that died
# ends (and says so) instead of waiting for an agent that never comes back.
INSTALL_GIVE_UP = INSTALL_TIMEOUT * INSTALL_RETRY.maximum_attempts + timedelta(minutes=30)

# Launching is idempotent on the agent (it adopts a process it already started), so a retry
# after a lost worker or agent never starts a second engine.
START_TIMEOUT = timedelta(minutes=2)
START_RETRY = RetryPolicy(
    maximum_attempts=5,
    initial_interval=timedelta(seconds=1),
    non_retryable_error_types=["EngineNotRunnable"],
)
# Every attempt together, waits in the node's queue included. START_TIMEOUT alone counts only
# once an agent has taken the launch: on a machine that died nobody ever takes it, and the
# replica would hold its allocation forever. Past this the launch is a failed start (backoff,
# then re-placement after CRASH_LOOP_LIMIT of them); a stop does not wait for it at all.
START_GIVE_UP = START_TIMEOUT * (START_RETRY.maximum_attempts or 1) + timedelta(minutes=1)

# Loading weights legitimately takes minutes for large models.
READY_TIMEOUT = timedelta(minutes=15)
READY_HEARTBEAT = timedelta(seconds=30)
# A few tries cover an agent restart mid-load; after that the replica restarts with backoff.
READY_RETRY = RetryPolicy(maximum_attempts=3)
# All attempts and queue waits together, for the same reason as START_GIVE_UP.
READY_GIVE_UP = READY_TIMEOUT * (READY_RETRY.maximum_attempts or 1) + timedelta(minutes=5)

# Supervision lasts as long as the engine. A missed heartbeat means the agent died: the retry
# lands on the restarted agent, which adopts the engine (or reports it gone). Each attempt ends
# after a day and the retry (no history event) takes over: a 10-year timeout let the
# time-skipping test server jump ten years ahead, past every workflow's default timeout.
# A node fetching a model's weights from the mirror (activities/agent/artifact_fetch.py): an
# attempt may take hours for a large model, so it heartbeats its progress, and an agent that
# dies mid-fetch is noticed within FETCH_HEARTBEAT; the next attempt resumes from what is on
# disk. FETCH_GIVE_UP bounds every attempt and queue wait together.
FETCH_TIMEOUT = timedelta(hours=12)
FETCH_HEARTBEAT = timedelta(minutes=1)
FETCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    maximum_interval=timedelta(minutes=1),
    # Permanent: the manifest is not one, or the disk cannot hold it. The replica exits with
    # the reason and tries again after its restart back-off.
    non_retryable_error_types=["BadArtifact", "NoSpace"],
)
FETCH_GIVE_UP = timedelta(hours=24)
# A replica waits for a node's fetch (the ArtifactFetch workflow) through a control activity
# (activities/control/artifact_fetches.py) that joins or starts it and heartbeats while it
# waits. A control worker that dies is noticed within AWAIT_FETCH_HEARTBEAT and the retry joins
# the same fetch again; bounded by the fetch's own bound, with room for its queue waits.
AWAIT_FETCH_HEARTBEAT = timedelta(minutes=1)
AWAIT_FETCH_GIVE_UP = FETCH_GIVE_UP + timedelta(hours=1)
AWAIT_FETCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
# Today's replicas join a fetch with a short control activity (a signal-with-start), and wait
# in their own workflow for the fetch's signal, up to AWAIT_FETCH_GIVE_UP as before: no
# activity slot is held while a download takes hours. Every FETCH_REJOIN a replica still
# waiting joins again, so a fetch that closed without telling it (terminated by an operator)
# is started again rather than waited on for a day; a join costs the replica about ten events.
JOIN_FETCH_TIMEOUT = timedelta(seconds=30)
JOIN_FETCH_RETRY = LEDGER_RETRY
JOIN_FETCH_GIVE_UP = timedelta(minutes=5)
FETCH_REJOIN = timedelta(minutes=30)

# Loading a running engine's new LoRA adapters (and unloading those it no longer lists): each
# load reads an adapter's weights, seconds for the usual sizes. A few tries cover an agent
# restart; an engine's refusal is final (the replica is then replaced instead), as is an engine
# that is gone or cannot load adapters at runtime.
SET_ADAPTERS_TIMEOUT = timedelta(minutes=5)
SET_ADAPTERS_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    maximum_attempts=3,
    non_retryable_error_types=[
        "AdapterRefused",
        "EngineGone",
        "NoRuntimeAdapters",
        "WeightsMissing",
    ],
)
SET_ADAPTERS_GIVE_UP = SET_ADAPTERS_TIMEOUT * 3 + timedelta(minutes=5)

SUPERVISE_TIMEOUT = timedelta(days=1)
SUPERVISE_HEARTBEAT = timedelta(seconds=20)
SUPERVISE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10)
)

# A stop of a serving replica first waits for gateways to drop its route, then for its
# in-flight requests to finish (up to DRAIN_TIMEOUT), so a drain or scale-down drops nothing.
ROUTE_PROPAGATION = timedelta(seconds=3)
DRAIN_TIMEOUT = timedelta(minutes=2)
STOP_TIMEOUT = timedelta(minutes=1) + DRAIN_TIMEOUT
# One stop attempt waits this long for the node's agent to take it at all. Then the replica
# asks the ledger whether the node is gone (lost or removed): only then is the allocation freed
# without the engine known stopped. Otherwise it tries again on the STOP_RETRY_WAIT ladder,
# holding the allocation (the engine may still hold its GPUs) with its route not routable.
STOP_GIVE_UP = timedelta(minutes=5)
STOP_RETRY = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=10))
STOP_RETRY_WAIT_FIRST = timedelta(seconds=5)
STOP_RETRY_WAIT_MAX = timedelta(minutes=1)
# A replica whose node is gone frees its allocation at once, after one stop this short: an
# agent that is in fact back stops the engine now rather than when it notices the orphan.
STOP_ON_GONE_NODE = timedelta(seconds=15)

# Engine restart backoff: 1, 2, 4 ... seconds, capped; reset after a run this long.
RESTART_BACKOFF_MAX = timedelta(seconds=60)
RESTART_BACKOFF_RESET_AFTER = timedelta(minutes=5)
# This many failures in a row on one node (none after a run of RESTART_BACKOFF_RESET_AFTER)
# and the replica stops its engine, releases, and places itself on another node: a bad GPU or
# a broken engine install there should not hold the replica down. With no other node to take
# it, it goes back to the same one.
CRASH_LOOP_LIMIT = 5

# A model looks this often whether its replica workflows still run (one an operator terminated
# left its engine, allocation and route behind), and this often while a removal waits for its
# stopping replicas to close. Describing workflows by ID is cheap and bounded.
# LLMGW_TEST_REPLICA_CHECK_EVERY_S (tests only) shortens the look, read when a run starts.
REPLICA_CHECK_EVERY = timedelta(
    seconds=float(os.environ.get("LLMGW_TEST_REPLICA_CHECK_EVERY_S", "") or 60)
)
STOPPING_POLL = timedelta(seconds=5)
# A model starts at most this many replica workflows in one run, then continues as new: each
# is a pending child of the run that started it until it closes (ABANDON does not change that),
# and Temporal allows 2,000 pending children per run. Starting 500 costs the run about 2,000
# history events, well inside its budget.
REPLICAS_STARTED_PER_RUN = 500
# ...and asks for at most this many starts in one workflow task. Each started replica's first
# workflow task then runs on the control worker at once, beside the model's own: with 100 at a
# time, on a loaded 2-core machine, the model's task waited past the SDK's 2 s deadlock
# detector. Twenty keep that burst small and still start 2,100 replicas in about a minute.
REPLICAS_STARTED_TOGETHER = 20


def replicas_started_per_run() -> int:
    """REPLICAS_STARTED_PER_RUN, unless LLMGW_TEST_REPLICAS_STARTED_PER_RUN (tests, and the
    replays of the histories they recorded) lowers it. Read at each use."""
    knob = os.environ.get("LLMGW_TEST_REPLICAS_STARTED_PER_RUN", "")
    return int(knob) if knob else REPLICAS_STARTED_PER_RUN


DESCRIBE_WORKFLOWS_TIMEOUT = timedelta(seconds=30)
DESCRIBE_WORKFLOWS_GIVE_UP = timedelta(minutes=2)
# A check sends at most this many workflow IDs to one activity (about 30 KB), the batches at
# once: 10,000 replicas are 10 activities, each describing its IDs 32 at a time
# (activities/control/workflow_status.py), well inside DESCRIBE_WORKFLOWS_TIMEOUT.
REPLICA_CHECK_BATCH = 1000
# A dead replica's engine: its route is withdrawn, in-flight requests get ORPHAN_DRAIN to
# finish, and its node's agent is asked to stop it for at most ORPHAN_STOP_GIVE_UP (a node that
# does not answer stops engines no running workflow owns when its agent returns).
ORPHAN_DRAIN = timedelta(seconds=30)
ORPHAN_STOP_GIVE_UP = timedelta(minutes=2)

# A replica nobody can take yet retries placement on this ladder.
PLACEMENT_RETRY_MAX = timedelta(seconds=30)

# Node liveness: agents heartbeat every NODE_HEARTBEAT. A node silent for NODE_GRACE is
# unreachable: gateways stop sending it requests, but its engines keep their allocations, so a
# partition that heals costs no restart. Silent for NODE_GONE_GRACE it is lost: its replicas
# start elsewhere (a model reload costs minutes; five of silence is a machine that is gone).
NODE_HEARTBEAT = timedelta(seconds=10)
NODE_GRACE = timedelta(seconds=45)
NODE_GONE_GRACE = timedelta(minutes=5)
# A liveness timer that fires this much later than it was due means the control plane itself
# (Temporal, its database, the control worker) was away: the agents' heartbeats could not
# arrive, so their silence says nothing about the nodes, and every node gets a fresh grace.
CONTROL_PLANE_AWAY = timedelta(seconds=5)
# The liveness watch (workflows/node/watch.py): the agent holds one activity and heartbeats it
# to Temporal, which writes no history for a heartbeat; the activity returns this often at
# most (activities on a node's queue are bounded), or at once when the machine changed. Each
# return costs the node workflow six history events, 144 a day at one an hour. Liveness does not
# wait for it: silence is judged by the watch's heartbeat timeout (half the grace) and its
# schedule-to-start window, whatever the period. LLMGW_TEST_NODE_WATCH_PERIOD_S (tests and
# the liveness benchmark only) shortens it, read when a worker imports this module.
NODE_WATCH_PERIOD = timedelta(
    seconds=float(os.environ.get("LLMGW_TEST_NODE_WATCH_PERIOD_S", "") or 60 * 60)
)
# How often the agent re-verifies its installed engines while it holds the watch (an upgrade
# elsewhere can take a library away). Only a result that differs returns the watch, so a node
# whose engines still run costs no history for it.
ENGINE_REVERIFY_ON_NODE = timedelta(minutes=10)
# A watch the agent failed (not a timeout: the agent answered, so it is alive) is asked again
# after this long (at most half the node's grace), so a broken agent cannot make its workflow
# spin.
NODE_WATCH_RETRY_PAUSE = timedelta(seconds=10)
# Node workflow steps on the control queue and the node's own queue.
ENGINE_PLAN_TIMEOUT = timedelta(seconds=30)
DISCOVER_TIMEOUT = timedelta(minutes=2)
VERIFY_ENGINES_TIMEOUT = timedelta(minutes=5)
# Refresh and re-verification are best-effort: the next schedule tries again.
NODE_CHECK_RETRY = RetryPolicy(maximum_attempts=2)
# How long one look at a node's engine load may take (Autoscale.look_every_s says how often).
ENGINE_LOAD_TIMEOUT = timedelta(seconds=10)
ENGINE_LOAD_RETRY = RetryPolicy(maximum_attempts=1)
# One look at a whole model's load (activities/control/model_load.py): it reads every hosting
# node's metrics within its own budget (20 s) and answers with what it read; a look that fails
# is a blind look, and the next one comes `look_every_s` later.
MODEL_LOAD_TIMEOUT = timedelta(seconds=40)
MODEL_LOAD_RETRY = RetryPolicy(maximum_attempts=1)
# Nodes whose metrics a look could not read (no `--metrics-port`, or not reachable from the
# control worker) are asked through their agent's queue, at most this many a look (chosen at
# random), so a look costs a bounded number of history events whatever the fleet.
LOAD_AGENTS_ASKED_PER_LOOK = 8

# How often a draining node looks whether its replicas have all moved.
DRAIN_POLL = timedelta(seconds=5)
