"""What the control worker runs outside workflows: ledger calls, node admin, the engine plan and
nodes file, and asking Temporal whether workflows still run."""
