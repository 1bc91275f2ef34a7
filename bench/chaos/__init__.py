"""`make chaos`: a fault campaign on a real `llmgw up` (Temporal dev server, control worker,
agent, gateway and llama-server serving the demo model at 2 replicas), under steady load.

Each round kills (SIGKILL) or freezes (SIGSTOP, then SIGCONT) one process, waits until the
system has converged again, and records what it cost: failed requests, engine restarts, replicas
lost or duplicated, devices double-booked, time to converge. Modules:
  plan      which process each round hits, and how (pure, seeded)
  load      the steady request load and what each request came to
  observe   what the machine and the ledger say right now (a Snapshot)
  checks    the invariants a Snapshot must pass (pure)
  inject    signalling the chosen process
  system    starting and stopping `llmgw up` in a state dir of its own
  report    the arithmetic and the printed table (pure)
  campaign  the loop and the command line
"""
