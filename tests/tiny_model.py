"""A 2-layer llama GGUF with random weights and the default model's tokenizer, for fast tests.

Written at test time (about 29 MB, mostly the 49152-token embedding) rather than committed.
head_dim 64 keeps every cache type possible (q8_0/q4_0 blocks of 32) and lets llama.cpp's
Hadamard rotation of quantized caches apply, as it does on real models.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 2, 256, 4, 2, 64, 512


def write_tiny_model(path: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    source = gguf.GGUFReader(tokenizer_source)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)
    n_vocab = len(source.fields["tokenizer.ggml.tokens"].contents())

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)

    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    for il in range(N_LAYER):
        blk = f"blk.{il}."
        writer.add_tensor(blk + "attn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(blk + "attn_q.weight", weight(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(blk + "attn_k.weight", weight(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(blk + "attn_v.weight", weight(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(blk + "attn_output.weight", weight(N_EMBD, N_HEAD * HEAD_DIM))
        writer.add_tensor(blk + "ffn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(blk + "ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(blk + "ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(blk + "ffn_down.weight", weight(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
