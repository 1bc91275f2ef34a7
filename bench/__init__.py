"""Benchmarks and the fault campaign: commands that measure llmgw, never tests. They sit above
workers/ because they drive its processes."""
