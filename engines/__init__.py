"""Per-engine knowledge: one adapter per engine (adapter.py; registry.py finds it by name) for
its installer, command lines, environment and metrics, over the helper modules here."""
