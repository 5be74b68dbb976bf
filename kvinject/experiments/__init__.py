"""Experiments: grids of configurations and benchmarks, running them into results stores, and
the studies built on them (sensitivity profiles, layer-wise divergence)."""
