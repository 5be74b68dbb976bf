"""The engine: a GGUF model in llama.cpp, contexts whose KV cache takes error through the
compiled graph callback, decoding with and without the cache, and what reached the cache.

It knows error models only by the contract in :mod:`kvinject.engine.perturbation`."""
