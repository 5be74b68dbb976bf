"""The engine: a GGUF model in llama.cpp, contexts whose KV cache takes error through the
compiled graph callback, decoding with and without the cache, and what reached the cache.

It knows error models only by the contract in :mod:`kvinject.engine.perturbation`. Its top
holds that contract and what error models build on (targets, positions, options, noise
streams, laws, the bits a fault lands in, realized error) and the llama.cpp binding (model,
context, ggml, log); its rooms, from the ground up, are ``callback`` (compiled), ``gpu``,
``graph`` (the hook), ``cache`` (the resident cache) and ``generation``."""
