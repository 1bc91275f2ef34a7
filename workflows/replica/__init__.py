"""The replica workflow (workflow.py): one replica's life from placement to stop, its engine's
runs, adapters, adoption of a running engine, the wait for its weights, and the rules it decides
by (rules.py)."""
