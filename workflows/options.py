"""Activity timeouts and retry policies, named, with the reasoning beside them."""

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

# Launching is idempotent on the agent (it adopts a process it already started), so a retry
# after a lost worker or agent never starts a second engine.
START_TIMEOUT = timedelta(minutes=2)
START_RETRY = RetryPolicy(
    maximum_attempts=5,
    initial_interval=timedelta(seconds=1),
    non_retryable_error_types=["EngineNotRunnable"],
)

# Loading weights legitimately takes minutes for large models.
READY_TIMEOUT = timedelta(minutes=15)
READY_HEARTBEAT = timedelta(seconds=30)
# A few tries cover an agent restart mid-load; after that the replica restarts with backoff.
READY_RETRY = RetryPolicy(maximum_attempts=3)

# Supervision lasts as long as the engine. A missed heartbeat means the agent died: the retry
# lands on the restarted agent, which adopts the engine (or reports it gone).
SUPERVISE_TIMEOUT = timedelta(days=3650)
SUPERVISE_HEARTBEAT = timedelta(seconds=20)
SUPERVISE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10)
)

# A stop of a serving replica first waits for gateways to drop its route, then for its
# in-flight requests to finish (up to DRAIN_TIMEOUT), so a drain or scale-down drops nothing.
ROUTE_PROPAGATION = timedelta(seconds=3)
DRAIN_TIMEOUT = timedelta(minutes=2)
STOP_TIMEOUT = timedelta(minutes=1) + DRAIN_TIMEOUT
# A stop waits this long for the node's agent to take it at all; then the replica releases its
# resources anyway (a returning agent stops engines no running workflow owns).
STOP_GIVE_UP = timedelta(minutes=5)
STOP_RETRY = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=10))

# Engine restart backoff: 1, 2, 4 ... seconds, capped; reset after a run this long.
RESTART_BACKOFF_MAX = timedelta(seconds=60)
RESTART_BACKOFF_RESET_AFTER = timedelta(minutes=5)

# A replica nobody can take yet retries placement on this ladder.
PLACEMENT_RETRY_MAX = timedelta(seconds=30)

# Node liveness: agents heartbeat every NODE_HEARTBEAT; a node silent for NODE_GRACE is lost.
NODE_HEARTBEAT = timedelta(seconds=10)
NODE_GRACE = timedelta(seconds=45)
# Node workflow steps on the control queue and the node's own queue.
ENGINE_PLAN_TIMEOUT = timedelta(seconds=30)
DISCOVER_TIMEOUT = timedelta(minutes=2)
VERIFY_ENGINES_TIMEOUT = timedelta(minutes=5)
# Refresh and re-verification are best-effort: the next schedule tries again.
NODE_CHECK_RETRY = RetryPolicy(maximum_attempts=2)
# How long one look at a node's engine load may take (Autoscale.look_every_s says how often).
ENGINE_LOAD_TIMEOUT = timedelta(seconds=10)
ENGINE_LOAD_RETRY = RetryPolicy(maximum_attempts=1)

# How often a draining node looks whether its replicas have all moved.
DRAIN_POLL = timedelta(seconds=5)
