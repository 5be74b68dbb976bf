"""kvinject: inject controlled error into the KV cache of llama.cpp models."""

__version__ = "0.1.0"
