"""Benchmarks scored under K/V error."""
