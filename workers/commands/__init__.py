"""The CLI's commands that talk to a running cluster, one module per noun: model, node, ledger,
mirror and store (workers/cli.py wires them)."""
