"""What runs outside workflows: the control plane's ledger calls and each node agent's work."""
