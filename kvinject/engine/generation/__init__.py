"""Decoding on a context: continuous batching, the cache-free reference, the choice between
them, and the log-likelihood of continuations."""
