"""Per-engine knowledge: command lines, environments and installers."""
