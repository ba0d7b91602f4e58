"""Benchmarks: scripts that print figures and write reports (never timed tests)."""
